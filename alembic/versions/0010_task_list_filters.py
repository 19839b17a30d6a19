"""tasks: indexes for the task list filtered by status or by task type, newest first

`GET /api/v1/tasks?status=` and `?task_type=` (with a created-time range and keyset paging on
`created_at`) read an index range in order instead of filtering a scan of every task.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_tasks_status_created_at": ["status", "created_at"],
    "ix_tasks_task_type_created_at": ["task_type", "created_at"],
}


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        for name, columns in INDEXES.items():
            batch_op.create_index(name, columns, unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        for name in INDEXES:
            batch_op.drop_index(name)
