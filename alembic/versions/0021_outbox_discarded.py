"""outbox: a dead letter an operator settles by hand is `discarded` (who, when, why)

A dead letter could only be retried. One the backend refuses for good (a 422 for those bytes)
stayed dead for ever: the task's later events waited behind it (events of one task are
delivered in order), and `orchestrator_outbox_dead` never went back down, so an alert on it
never cleared. An operator who dealt with it by hand now discards it (`outbox discard`): the
status `discarded` (the CHECK `ck_outbox_status` allows it), and `discarded_at`,
`discarded_by` and `discard_reason` say when, who and why.

Downgrade: a discarded row becomes `dead` again (the only status before that is not sent, and
holds the task's later events back as it did), and the three columns go.

SQLite cannot alter a constraint, so the batch context recreates the table there.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_NAME = "ck_outbox_status"


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("discarded_by", sa.String(200), nullable=True))
        batch_op.add_column(sa.Column("discard_reason", sa.Text(), nullable=True))
        batch_op.drop_constraint(op.f(_NAME), type_="check")
        batch_op.create_check_constraint(
            op.f(_NAME), "status IN ('pending', 'delivered', 'dead', 'discarded')"
        )


def downgrade() -> None:
    op.execute("UPDATE outbox SET status = 'dead' WHERE status = 'discarded'")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_constraint(op.f(_NAME), type_="check")
        batch_op.create_check_constraint(op.f(_NAME), "status IN ('pending', 'delivered', 'dead')")
        batch_op.drop_column("discard_reason")
        batch_op.drop_column("discarded_by")
        batch_op.drop_column("discarded_at")
