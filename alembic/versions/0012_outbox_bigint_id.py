"""outbox: a 64-bit id on Postgres

Every approval and every webhook of a task event takes an outbox id, and ids are never reused:
a 4-byte `INTEGER` (and the 4-byte sequence behind its `SERIAL`) runs out after 2^31 rows. On
Postgres the column becomes `BIGINT`, and its sequence too (`ALTER SEQUENCE ... AS bigint`,
which also lifts the sequence's maximum, still the 4-byte one): changing only the column would
leave the sequence to fail at 2^31 all the same. Existing rows keep their ids and the sequence
goes on where it was. No other table refers to the id. The column change rewrites the table
under an exclusive lock, which an outbox of delivered rows makes short.

SQLite's `INTEGER PRIMARY KEY` is the 64-bit rowid already (the models keep it `INTEGER` there,
which `AUTOINCREMENT` needs), so nothing changes on SQLite.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _sequence() -> str:
    """The sequence behind the outbox id, as Postgres names it (quoted where it must be)."""
    name = (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_serial_sequence('outbox', 'outbox_id')"))
        .scalar_one()
    )
    assert name, "the outbox id has no sequence"
    return str(name)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "outbox",
        "outbox_id",
        existing_type=sa.Integer(),
        type_=sa.BigInteger(),
        existing_nullable=False,
    )
    op.execute(f"ALTER SEQUENCE {_sequence()} AS bigint")


def downgrade() -> None:
    # Refused by Postgres (nothing changed) once an id or the sequence is past 2^31 - 1.
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"ALTER SEQUENCE {_sequence()} AS integer")
    op.alter_column(
        "outbox",
        "outbox_id",
        existing_type=sa.BigInteger(),
        type_=sa.Integer(),
        existing_nullable=False,
    )
