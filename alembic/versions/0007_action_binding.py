"""actions: the plan revision and the digest an approval is bound to

An approval names the SHA-256 of the action's kind and canonical payload, and the action keeps
the plan revision it was proposed under (DESIGN invariant 24). Existing actions get their digest
computed here; their plan revision stays unknown (NULL).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

INDEX = "ix_actions_task_id_node_id"


def _digest(kind: str, payload: Any) -> str:
    # The same canonical JSON as orchestrator.domain.fingerprints (kept here: a migration must
    # not change when the code does).
    if isinstance(payload, str):
        payload = json.loads(payload)
    text = json.dumps(
        {"kind": kind, "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plan_revision", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("digest", sa.String(length=64), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT action_id, kind, payload FROM actions")).all()
    for action_id, kind, payload in rows:
        conn.execute(
            sa.text("UPDATE actions SET digest = :digest WHERE action_id = :action_id"),
            {"digest": _digest(kind, payload), "action_id": action_id},
        )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.alter_column("digest", existing_type=sa.String(length=64), nullable=False)
        batch_op.create_index(INDEX, ["task_id", "node_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(INDEX)
        batch_op.drop_column("digest")
        batch_op.drop_column("plan_revision")
