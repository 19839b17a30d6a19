"""tasks.intent_round: the request a task's writes belong to

Identical writes of one intent round share one receipt identity across the generations that
recovery and continuation start (seed 000: only a new explicit request may repeat a finished
write). A trigger starts round 1; an operator's requeue starts the next.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("intent_round", sa.Integer(), server_default="1", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("intent_round")
