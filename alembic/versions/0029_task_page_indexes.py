"""actions and outbox: the indexes an open task page's polls and its decided actions read

A task's view is polled every 3 s per open console tab, and its version (`store.task_versions`)
summed up every outbox row of the task: a task keeps its delivered webhooks
ORCH_RETENTION_DAYS, thousands for a busy one. The view shows the delivered and discarded ones
as counts per kind and status: `ix_outbox_settled` holds them, so each poll counts them from
the index alone. The first page of a task's decided actions (newest first, by created_at and
action_id) read each action of the task and sorted them: the index on
(task_id, created_at, action_id) is walked in the page's order instead. The tag read each
action of the task too: it reads the newest from that index, and counts the task's pending
ones from `ix_actions_pending_task_id`, which holds the pending ones alone.

On Postgres the three are built CONCURRENTLY, outside the migration's transaction: a live
installation goes on writing deliveries and actions while they are built. A build that was
interrupted leaves an invalid index behind and the store at 0028; the next upgrade drops it
first and builds it again.

Downgrade: the indexes go (concurrently on Postgres); the reads are as before, slower on busy
tasks.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

SETTLED = "ix_outbox_settled"
SETTLED_WHERE = sa.text("status IN ('delivered', 'discarded')")
TASK_ACTIONS = "ix_actions_task_id_created_at_action_id"
PENDING = "ix_actions_pending_task_id"
PENDING_WHERE = sa.text("status = 'pending_approval'")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        _drop_leftovers()
        op.create_index(
            SETTLED,
            "outbox",
            ["task_id", "kind", "status"],
            unique=False,
            postgresql_where=SETTLED_WHERE,
            sqlite_where=SETTLED_WHERE,
            postgresql_concurrently=True,
        )
        op.create_index(
            TASK_ACTIONS,
            "actions",
            ["task_id", "created_at", "action_id"],
            unique=False,
            postgresql_concurrently=True,
        )
        op.create_index(
            PENDING,
            "actions",
            ["task_id"],
            unique=False,
            postgresql_where=PENDING_WHERE,
            sqlite_where=PENDING_WHERE,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(PENDING, table_name="actions", postgresql_concurrently=True)
        op.drop_index(TASK_ACTIONS, table_name="actions", postgresql_concurrently=True)
        op.drop_index(SETTLED, table_name="outbox", postgresql_concurrently=True)


def _drop_leftovers() -> None:
    """An index of this migration that exists before it ran can only be what an interrupted
    concurrent build left (Postgres keeps it, invalid): dropped, it is built anew."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in (SETTLED, TASK_ACTIONS, PENDING):
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
