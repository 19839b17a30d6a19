"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_leases_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("task_type", sa.String(length=64), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column(
            "context",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "sample_input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("trigger_id", sa.String(length=128), nullable=False),
        sa.Column("origin", sa.String(length=24), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=True),
        sa.Column("failure_code", sa.String(length=64), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("recoveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("rounds", sa.Integer(), server_default="0", nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("origin IN ('live', 'peripheral_sample')", name=op.f("ck_tasks_origin")),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_tasks_status"),
        ),
        sa.CheckConstraint("generation >= 1", name=op.f("ck_tasks_generation_positive")),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("trigger_id", name=op.f("uq_tasks_trigger_id")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_created_at"), ["created_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_tasks_status_updated_at"), ["status", "updated_at"], unique=False
        )

    op.create_table(
        "executions",
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("celery_task_id", sa.String(length=64), nullable=True),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("failure_code", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('completed', 'waiting', 'continue', 'failed', 'lost', 'cancelled', 'superseded')",
            name=op.f("ck_executions_outcome"),
        ),
        sa.CheckConstraint("generation >= 1", name=op.f("ck_executions_generation_positive")),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_executions_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "generation", name=op.f("pk_executions")),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_executions_outcome_lease_expires_at"),
            ["outcome", "lease_expires_at"],
            unique=False,
        )

    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("purpose", sa.String(length=24), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "purpose = 'ordinary_chat' OR task_id IS NOT NULL",
            name=op.f("ck_sessions_task_sessions_name_task"),
        ),
        sa.CheckConstraint(
            "purpose IN ('ordinary_chat', 'task_execution', 'task_collaboration')",
            name=op.f("ck_sessions_purpose"),
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_sessions_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_sessions")),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sessions_purpose_created_at_session_id"),
            ["purpose", "created_at", "session_id"],
            unique=False,
        )
        batch_op.create_index(batch_op.f("ix_sessions_task_id"), ["task_id"], unique=False)

    op.create_table(
        "actions",
        sa.Column("action_id", sa.String(length=36), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("decided_by", sa.String(length=128), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('work_order', 'command')", name=op.f("ck_actions_kind")),
        sa.CheckConstraint(
            "status = 'pending_approval' OR status = 'superseded' OR decided_by IS NOT NULL",
            name=op.f("ck_actions_decision_has_decider"),
        ),
        sa.CheckConstraint(
            "status IN ('pending_approval', 'approved', 'rejected', 'superseded')",
            name=op.f("ck_actions_status"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_actions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_actions_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("action_id", name=op.f("pk_actions")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_actions_status_created_at"), ["status", "created_at"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_actions_task_id_generation"), ["task_id", "generation"], unique=False
        )

    op.create_table(
        "collaboration_messages",
        sa.Column("message_id", sa.String(length=36), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "role IN ('user', 'agent')", name=op.f("ck_collaboration_messages_role")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_collaboration_messages_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_collaboration_messages")),
    )
    with op.batch_alter_table("collaboration_messages", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_collaboration_messages_session_id_created_at"),
            ["session_id", "created_at"],
            unique=False,
        )

    op.create_table(
        "evidence",
        sa.Column("evidence_id", sa.String(length=36), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("queried_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_ref", sa.String(length=255), nullable=False),
        sa.Column("origin", sa.String(length=24), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "origin IN ('live', 'synthetic', 'peripheral_sample')", name=op.f("ck_evidence_origin")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_evidence_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_evidence_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("evidence_id", name=op.f("pk_evidence")),
    )
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_evidence_task_id_generation"), ["task_id", "generation"], unique=False
        )

    op.create_table(
        "invocation_receipts",
        sa.Column("invocation_id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=True),
        sa.Column("tool_name", sa.String(length=128), nullable=False),
        sa.Column("identity_key", sa.String(length=255), nullable=False),
        sa.Column("args_digest", sa.String(length=64), nullable=False),
        sa.Column("claim_token", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'pending', 'unknown')",
            name=op.f("ck_invocation_receipts_status"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_invocation_receipts_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("invocation_id", name=op.f("pk_invocation_receipts")),
        sa.UniqueConstraint(
            "owner", "identity_key", name=op.f("uq_invocation_receipts_owner_identity_key")
        ),
    )
    with op.batch_alter_table("invocation_receipts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_invocation_receipts_owner_tool_name_args_digest"),
            ["owner", "tool_name", "args_digest"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_invocation_receipts_session_id"), ["session_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_invocation_receipts_status_updated_at"),
            ["status", "updated_at"],
            unique=False,
        )

    op.create_table(
        "plan_revisions",
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("schema_version", sa.String(length=32), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "nodes",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "edges",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("content_digest", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("revision >= 1", name=op.f("ck_plan_revisions_revision_positive")),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_plan_revisions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "revision", name=op.f("pk_plan_revisions")),
        sa.UniqueConstraint(
            "session_id", "request_id", name=op.f("uq_plan_revisions_session_id_request_id")
        ),
    )
    with op.batch_alter_table("plan_revisions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_plan_revisions_task_id_generation"),
            ["task_id", "generation"],
            unique=False,
        )

    op.create_table(
        "recovery_snapshots",
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column(
            "messages",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "receipts",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "unknown_calls",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_recovery_snapshots_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_recovery_snapshots")),
    )
    op.create_table(
        "reports",
        sa.Column("report_id", sa.String(length=36), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column(
            "findings",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "evidence_refs",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "outcome IN ('completed', 'waiting', 'failed', 'continue')",
            name=op.f("ck_reports_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_reports_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_reports_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("report_id", name=op.f("pk_reports")),
    )
    with op.batch_alter_table("reports", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_reports_task_id_generation_created_at"),
            ["task_id", "generation", "created_at"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("reports", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reports_task_id_generation_created_at"))

    op.drop_table("reports")
    op.drop_table("recovery_snapshots")
    with op.batch_alter_table("plan_revisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_plan_revisions_task_id_generation"))

    op.drop_table("plan_revisions")
    with op.batch_alter_table("invocation_receipts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_invocation_receipts_status_updated_at"))
        batch_op.drop_index(batch_op.f("ix_invocation_receipts_session_id"))
        batch_op.drop_index(batch_op.f("ix_invocation_receipts_owner_tool_name_args_digest"))

    op.drop_table("invocation_receipts")
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evidence_task_id_generation"))

    op.drop_table("evidence")
    with op.batch_alter_table("collaboration_messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_collaboration_messages_session_id_created_at"))

    op.drop_table("collaboration_messages")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_actions_task_id_generation"))
        batch_op.drop_index(batch_op.f("ix_actions_status_created_at"))

    op.drop_table("actions")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sessions_task_id"))
        batch_op.drop_index(batch_op.f("ix_sessions_purpose_created_at_session_id"))

    op.drop_table("sessions")
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_executions_outcome_lease_expires_at"))

    op.drop_table("executions")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_status_updated_at"))
        batch_op.drop_index(batch_op.f("ix_tasks_created_at"))

    op.drop_table("tasks")
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_leases_expires_at"))

    op.drop_table("leases")
