"""transcript_entries: the durable transcript of every model turn and tool result;
recovery_snapshots.summary: why the round ended, its generation and its last plan

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "transcript_entries",
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("call_id", sa.String(length=128), nullable=True),
        sa.Column("parent_call_id", sa.String(length=128), nullable=True),
        sa.Column("tool_name", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column(
            "body",
            _JSON,
            nullable=False,
        ),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('model_turn', 'tool_result', 'summary')",
            name=op.f("ck_transcript_entries_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.session_id"],
            name=op.f("fk_transcript_entries_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_transcript_entries")),
    )
    op.create_index(
        op.f("ix_transcript_entries_task_id_generation_seq"),
        "transcript_entries",
        ["task_id", "generation", "seq"],
        unique=False,
    )
    with op.batch_alter_table("recovery_snapshots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("summary", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("recovery_snapshots", schema=None) as batch_op:
        batch_op.drop_column("summary")
    op.drop_index(
        op.f("ix_transcript_entries_task_id_generation_seq"), table_name="transcript_entries"
    )
    op.drop_table("transcript_entries")
