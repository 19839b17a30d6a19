"""outbox: an index of each task's rows not yet delivered or discarded

What a held task event waits behind is its task's earliest webhook not delivered or discarded,
and a webhook is due only when no earlier one of its task is still to send. Both were read from
the index on (task_id, kind, event_seq), which holds every webhook: a task keeps its delivered
ones ORCH_RETENTION_DAYS, thousands for a busy one, and each look walked them. Measured on
Postgres 15, 20 tasks of 5,000 delivered webhooks each: a page of their pending webhooks with
what each waits behind 31.7 ms (40,060 rows read) against 1.6 ms, and a dispatcher's claim of
the due ones 68 ms (60,060 rows) against 1.2 ms. This index holds only the rows still to send
or dead, a few per task. SQLite gets the same partial index.

On Postgres it is built CONCURRENTLY, outside the migration's transaction: a live installation
goes on queueing webhooks (one per task event) and recording deliveries while it is built,
where a plain CREATE INDEX held every write to the outbox until the build was over (and the build
waits first for every transaction open on the outbox). With 1,000,000 webhooks (437 MB), a
webhook queued during the plain build waited 185 ms, beside the concurrent one 6.4 ms at most
(1.2 ms median, 19 queued); the concurrent build took 538 ms against 300. A build
that was interrupted leaves an invalid index behind and the store at 0027; the next upgrade
drops it first and builds it again. An installation already at 0028 or later built the index
the old way and is unaffected: Alembic never runs a migration its store is stamped past.

Downgrade: the index goes (concurrently on Postgres); the reads are as before, slower on tasks
with many delivered rows.

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
    with op.get_context().autocommit_block():
        _drop_leftover()
        op.create_index(
            NAME,
            "outbox",
            ["task_id", "kind", "event_seq"],
            unique=False,
            postgresql_where=UNSETTLED,
            sqlite_where=UNSETTLED,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _drop()


def _drop_leftover() -> None:
    """The index, if it exists before this migration ran, can only be what an interrupted
    concurrent build left (Postgres keeps it, invalid), or a build whose stamp did not follow:
    dropped, it is built anew."""
    if op.get_bind().dialect.name == "postgresql":
        _drop()


def _drop() -> None:
    # If it exists: a run interrupted after this drop, before the store was stamped, runs again.
    op.drop_index(NAME, table_name="outbox", postgresql_concurrently=True, if_exists=True)
