"""invocation_receipts: the content index holds only unresolved receipts

The (owner, tool_name, args_digest) index serves one look-up: an identical earlier write that is
still `running` or `unknown`. As a partial index it stays small, and the planner of a table not
yet analyzed can no longer pick it for a claim's read back by (owner, identity_key), which then
filtered all of the owner's receipts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NAME = "ix_invocation_receipts_owner_tool_name_args_digest"
COLUMNS = ["owner", "tool_name", "args_digest"]
UNRESOLVED = sa.text("status IN ('running', 'unknown')")


def upgrade() -> None:
    with op.batch_alter_table("invocation_receipts", schema=None) as batch_op:
        batch_op.drop_index(NAME)
        batch_op.create_index(
            NAME, COLUMNS, unique=False, postgresql_where=UNRESOLVED, sqlite_where=UNRESOLVED
        )


def downgrade() -> None:
    with op.batch_alter_table("invocation_receipts", schema=None) as batch_op:
        batch_op.drop_index(NAME)
        batch_op.create_index(NAME, COLUMNS, unique=False)
