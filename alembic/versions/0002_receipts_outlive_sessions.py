"""receipts outlive their session's row; tasks indexed by (status, queued_at)

Deleting a session no longer cascades to every receipt: `running` and `unknown` receipts are
recovery boundaries (seed 000) and become orphans (`session_id` NULL) that retention never
deletes for age. The finished ones go with the session explicitly
(`ReceiptLedger.delete_session`). The sweeper's stale-queued query filters on
`status = 'queued' AND queued_at < x`, hence the index.

SQLite cannot alter a foreign key, so the batch context recreates the table there.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_FK = "fk_invocation_receipts_session_id_sessions"


def _receipts_fk(ondelete: str) -> None:
    with op.batch_alter_table("invocation_receipts", schema=None) as batch_op:
        batch_op.drop_constraint(_FK, type_="foreignkey")
        batch_op.create_foreign_key(
            _FK, "sessions", ["session_id"], ["session_id"], ondelete=ondelete
        )


def upgrade() -> None:
    _receipts_fk("SET NULL")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_tasks_status_queued_at"), ["status", "queued_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_status_queued_at"))
    _receipts_fk("CASCADE")
