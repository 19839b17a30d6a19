"""outbox: `released_at`, when an operator's retry or discard made a row deliverable again

`orchestrator_outbox_oldest_pending_seconds` measured a row's wait from when it was written.
An operator's retry of a three-day-old dead letter made it read three days at once, and the
task's later events, held behind the dead letter and released by the retry (or by a discard),
read their own age as well, one dispatcher pass each in order: an alert on the gauge fired
for a backlog that was draining, not for a dispatcher or a backend that was behind. The wait
is now measured from the later of when the row was written and `released_at`: set on the
retried row and on the pending webhooks of its task (those it held back) by a retry, and on
those by a discard. No existing column keeps the retry's time past the row's next attempt (the
attempt's hold and backoff overwrite `next_attempt_at`), hence this one.

Downgrade: the column goes; the gauge measures from the writing again.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("released_at")
