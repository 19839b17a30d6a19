"""hand-backs: a generation its worker gave back after an outage, counted apart from crashes

A round that stops itself because the store or Redis failed under it (or another holder took
its lease) hands its generation back: `executions.handed_back_at` records when. The
sweep that requeues such a generation counts it in `tasks.handbacks` (losses in a row of that
kind, parked at ORCH_MAX_HANDBACKS) instead of `tasks.recoveries` (losses of a worker that
died or stalled, parked at ORCH_MAX_RECOVERIES), so a flapping Redis or a Postgres restart
does not park tasks as if they crashed their workers. Existing rows: nothing handed back, no
hand-backs counted.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("handed_back_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("handbacks", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("handbacks")
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_column("handed_back_at")
