"""tasks: an index for the task list filtered by status and type at once

`GET /api/v1/tasks?status=...&task_type=...` (and `orchestrator tasks list --status --type`)
had an index for each filter alone. For a pair no task has while each value alone is common (no
failed leak, thousands of leaks and of failures), the planner takes the two for independent,
expects a match every few hundred rows, and walks the created_at index: through every task
(100,000 tasks: about 10-45 ms a list, for an empty page). With (status, task_type,
created_at) it can read the pair's own rows, newest first; and with statistics of the pairs
(Postgres' multivariate MCV list, gathered by ANALYZE as autovacuum runs it) it knows a pair is
rare, so it does (an index alone was not taken: the independence estimate still favoured the
walk).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

NAME = "ix_tasks_status_task_type_created_at"
#: Not a table's part in SQLAlchemy (autogenerate neither makes nor compares it): kept here.
STATISTICS = "tasks_status_task_type"
#: Whether `tasks` has rows enough for statistics worth gathering now.
_HAS_ROWS = "SELECT count(*) >= 1000 FROM (SELECT 1 FROM tasks LIMIT 1000) AS sampled"


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(NAME, ["status", "task_type", "created_at"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE STATISTICS {STATISTICS} (mcv) ON status, task_type FROM tasks")
        # Gathered at once only where there are tasks to gather them from (a sample of the rows:
        # a moment, not a scan of them all); elsewhere autovacuum's ANALYZE gathers them as the
        # table grows. Analysed empty, a new store's planner took `tasks` for empty: every
        # connection's cached plans for a task's row (the foreign-key checks of each transcript
        # entry, event and record, the fenced reads) scanned the whole table as it grew, about
        # 1.5 ms more of Postgres's CPU per execution in bench/executions.py until the next
        # ANALYZE. A table never analysed is planned as one of some pages, by its indexes.
        if op.get_bind().execute(sa.text(_HAS_ROWS)).scalar():
            op.execute("ANALYZE tasks")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(NAME)
