"""actions: an index for every action, newest first (`GET /api/v1/actions?any=true`)

The list of every action, whatever its status (`any=true`, `actions list --all`), had no index
in its order: each page read every action ever proposed and sorted them (23,000 actions: a scan
of the whole table for each page of 100). With (created_at, action_id) a page reads its rows.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

NAME = "ix_actions_created_at_action_id"


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index(NAME, ["created_at", "action_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(NAME)
