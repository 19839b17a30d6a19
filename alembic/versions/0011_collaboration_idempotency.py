"""collaboration_messages: an ask's idempotency key and request digest

A client that retries `POST /api/v1/sessions/{id}/messages` with the same `Idempotency-Key`
gets the first question and answer back instead of a second question (and a second model call).
Existing messages keep NULL in both columns; NULL keys never collide in the unique index.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

INDEX = "ix_collaboration_messages_session_id_idempotency_key_role"


def upgrade() -> None:
    with op.batch_alter_table("collaboration_messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("request_digest", sa.String(length=64), nullable=True))
        batch_op.create_index(INDEX, ["session_id", "idempotency_key", "role"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("collaboration_messages", schema=None) as batch_op:
        batch_op.drop_index(INDEX)
        batch_op.drop_column("request_digest")
        batch_op.drop_column("idempotency_key")
