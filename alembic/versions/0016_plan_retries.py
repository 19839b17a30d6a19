"""plan revisions: which node retries which failed node, kept with each revision

A retry of a failed node is a new node of its actor with an edge from it, drawn at or after the
failure (seed 004: 重试使用新节点). Which revision a node first appeared in is history one
revision's nodes and edges do not show, so the host keeps the relation with each revision it
writes: `plan_revisions.retries`, `{failed_id: [retry ids]}` (`domain.retries`). Existing rows
keep NULL: they are read by the rule of their time (any node of the failed node's actor with an
edge from it), so nothing stored changes meaning, and the next revision written over one starts
from that reading.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plan_revisions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "retries",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("plan_revisions", schema=None) as batch_op:
        batch_op.drop_column("retries")
