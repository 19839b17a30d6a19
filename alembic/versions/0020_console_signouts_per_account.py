"""console_signouts per account: an account's stored sign-outs are bounded

Each sign-out kept its session's nonce for the cookie's 12 hours, and every API process reads
them all every 2 seconds: an account signing in and out in a loop grew the table (and every
process's reads) without bound. A sign-out now names its account; past a cap, the account's
sign-outs fold into one time in `console_account_signouts`.

Going down drops those times, and the sign-outs they folded are gone: their cookies work
again until their 12 hours run out. To end every session after a downgrade, change
ORCH_CONSOLE_SECRET (which signs every browser out).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("console_signouts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("account", sa.String(length=128), nullable=True))
        batch_op.create_index(batch_op.f("ix_console_signouts_account"), ["account"])
    op.create_table(
        "console_account_signouts",
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("before", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("account", name=op.f("pk_console_account_signouts")),
    )


def downgrade() -> None:
    op.drop_table("console_account_signouts")
    with op.batch_alter_table("console_signouts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_console_signouts_account"))
        batch_op.drop_column("account")
