"""outbox: `discarded_from`, whether a discarded row was dead or still pending; who retried it

An operator could discard only a dead row. An approved action is retried until a 2xx: one the
backend answers 500 for every time (a bug on its side for that one payload) was sent for ever,
and nothing let an operator settle it. A pending row that no dispatcher is sending may now be
discarded too, and the row says which it was: a discarded row that was pending was never
dead-lettered (`dead_reason` is null for it, where a dead one says why it died). Rows discarded
before this migration were all dead: null reads as `dead`.

A discard recorded who, when and why; a retry none of it, so a row made due again (or hurried)
did not say by whom. `retried_at`, `retried_by` and `retry_note` record an operator's last
retry of the row (one row, or each row of `--all-dead` / `--all-failing`).

Downgrade: the columns go; rows discarded while pending then read as discarded dead letters,
and who retried a row is forgotten.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("discarded_from", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("retried_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("retried_by", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("retry_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("retry_note")
        batch_op.drop_column("retried_by")
        batch_op.drop_column("retried_at")
        batch_op.drop_column("discarded_from")
