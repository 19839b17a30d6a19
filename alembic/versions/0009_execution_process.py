"""executions: the host, pid and process start of the worker that claimed a generation

A worker that restarts, and every sweep, requeues at once the generations held by processes
of its own host that no longer exist, instead of waiting for their leases to run out.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEX = "ix_executions_worker_host_outcome"


def upgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker_host", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("worker_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("worker_started", sa.String(length=128), nullable=True))
        batch_op.create_index(INDEX, ["worker_host", "outcome"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(INDEX)
        batch_op.drop_column("worker_started")
        batch_op.drop_column("worker_pid")
        batch_op.drop_column("worker_host")
