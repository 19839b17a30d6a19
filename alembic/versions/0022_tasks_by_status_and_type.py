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

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

NAME = "ix_tasks_status_task_type_created_at"
#: Not a table's part in SQLAlchemy (autogenerate neither makes nor compares it): kept here.
STATISTICS = "tasks_status_task_type"


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(NAME, ["status", "task_type", "created_at"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE STATISTICS {STATISTICS} (mcv) ON status, task_type FROM tasks")
        op.execute("ANALYZE tasks")  # a sample of the rows: a moment, not a scan of them all


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(NAME)
