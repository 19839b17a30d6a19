"""task_events and outbox: what must reach the business backend, committed with the change

`task_events` is each task's ordered log (per-task `seq`, allocated under the task row lock):
the task stream's event ids. `outbox` holds the deliveries (approved actions, once per approval;
signed webhooks of task events), each written in the transaction of the change it reports.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "task_events",
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("data", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("seq >= 1", name=op.f("ck_task_events_seq_positive")),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_task_events_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "seq", name=op.f("pk_task_events")),
    )
    op.create_table(
        "outbox",
        sa.Column("outbox_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=True),
        sa.Column("action_id", sa.String(length=36), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('action', 'webhook')", name=op.f("ck_outbox_kind")),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'dead')", name=op.f("ck_outbox_status")
        ),
        sa.CheckConstraint(
            "(kind = 'action' AND action_id IS NOT NULL) "
            "OR (kind = 'webhook' AND event_seq IS NOT NULL)",
            name=op.f("ck_outbox_kind_reference"),
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_outbox_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("outbox_id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("action_id", name=op.f("uq_outbox_action_id")),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_outbox_status_next_attempt_at"), ["status", "next_attempt_at"]
        )
        batch_op.create_index(
            batch_op.f("ix_outbox_task_id_kind_event_seq"), ["task_id", "kind", "event_seq"]
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_outbox_task_id_kind_event_seq"))
        batch_op.drop_index(batch_op.f("ix_outbox_status_next_attempt_at"))
    op.drop_table("outbox")
    op.drop_table("task_events")
