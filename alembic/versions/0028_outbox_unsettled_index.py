"""outbox: an index of each task's rows not yet delivered or discarded

What a held task event waits behind is its task's earliest webhook not delivered or discarded,
and a webhook is due only when no earlier one of its task is still to send. Both were read from
the index on (task_id, kind, event_seq), which holds every webhook: a task keeps its delivered
ones ORCH_RETENTION_DAYS, thousands for a busy one, and each look walked them. Measured on
Postgres 15, 20 tasks of 5,000 delivered webhooks each: a page of their pending webhooks with
what each waits behind 31.7 ms (40,060 rows read) against 1.6 ms, and a dispatcher's claim of
the due ones 68 ms (60,060 rows) against 1.2 ms. This index holds only the rows still to send
or dead, a few per task.

Downgrade: the index goes; the reads are as before, slower on tasks with many delivered rows.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

NAME = "ix_outbox_unsettled"
UNSETTLED = sa.text("status NOT IN ('delivered', 'discarded')")


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index(
            NAME,
            ["task_id", "kind", "event_seq"],
            unique=False,
            postgresql_where=UNSETTLED,
            sqlite_where=UNSETTLED,
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index(NAME)
