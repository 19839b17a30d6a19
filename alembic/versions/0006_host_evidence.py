"""evidence: host-recorded facts (kind, parameters digest, result id, row and character counts)

Evidence records are written by the host from what a tool really returned (DESIGN invariant 21);
these columns hold what the host knows beside source, time, content reference and origin.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("kind", sa.String(24)),
    ("params_digest", sa.String(64)),
    ("result_id", sa.String(64)),
    ("row_count", sa.Integer()),
    ("char_count", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        for name, type_ in _COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        for name, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
