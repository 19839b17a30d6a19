"""outbox: `sending_since`, when the dispatcher posted the attempt its claim holds

A dispatcher claims a batch of due rows (each held, its attempt counted) and posts them one
after another. Every row of the batch read "being sent now" for as long as the claim held
(`claimed_until`), while the dispatcher had posted one of them: a backend slow on the first row
showed the whole batch being sent. The dispatcher now records when it posts a row's attempt;
a claimed row without it waits its turn in the batch.

Downgrade: the column goes; a claimed row then reads "being sent now" again, posted or not.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sending_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("sending_since")
