"""console_signouts: a console session signed out is refused everywhere until it would expire

The console's cookie is signed, not stored, so signing out only cleared it in that browser: a
copy (a shared machine, a proxy log, a screenshot of the developer tools) stayed good for its
12 hours. A sign-out now records the cookie's nonce until the cookie's own expiry, and every
API process refuses it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_signouts",
        sa.Column("nonce", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("signed_out_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("nonce", name=op.f("pk_console_signouts")),
    )
    with op.batch_alter_table("console_signouts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_console_signouts_expires_at"), ["expires_at"])


def downgrade() -> None:
    with op.batch_alter_table("console_signouts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_console_signouts_expires_at"))
    op.drop_table("console_signouts")
