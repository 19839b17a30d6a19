"""evidence: an index for a task's records in their order (`GET /api/v1/tasks/{id}/evidence`)

The evidence of a task is listed a page at a time, oldest first, by (created_at, evidence_id).
The only index was (task_id, generation): each page read every record of the task and sorted
them (a task with thousands of records: all of them for each page). With (task_id, created_at,
evidence_id) a page reads its rows.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

NAME = "ix_evidence_task_id_created_at_evidence_id"


def upgrade() -> None:
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.create_index(NAME, ["task_id", "created_at", "evidence_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.drop_index(NAME)
