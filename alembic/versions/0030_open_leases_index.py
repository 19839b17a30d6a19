"""executions: the sweep's index holds the claimed open generations only, not the queued ones

The index on (outcome, lease_expires_at) held every open execution, a queued backlog's too.
Every fenced write checks its generation with `task_id = ... AND generation = ... AND outcome
IS NULL`: the primary key finds that row, but when the table's statistics predated the backlog
(a store just set up, or one whose last analyse saw few open executions) the planner took the
outcome index instead and read every open execution to find it. With 3,000 tasks queued
behind 5,000 ended ones, each fenced statement read the 3,000 and took 0.73 ms in Postgres
against 0.14 ms, and a minimal execution 12.3 ms of Postgres CPU against 6.4 ms.

`ix_executions_open_leases` is on lease_expires_at, for the rows whose outcome is null and whose
lease expiry is set: claimed generations that run, wait or were handed back. The sweep's reads
(`lease_expires_at < now`, `<=`, `>`) and the count of handed-back generations imply its
predicate and use it; a fenced write's check does not, and reads its row by the primary key.
SQLite gets the same partial index.

On Postgres the new index is built CONCURRENTLY and the old one dropped CONCURRENTLY, outside
the migration's transaction: a live installation goes on writing while they change. A build
that was interrupted leaves an invalid index behind and the store at 0029; the next upgrade
drops it first and builds it again.

Downgrade: the old index comes back (concurrently on Postgres) and the new one goes.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

OPEN_LEASES = "ix_executions_open_leases"
OPEN_LEASES_WHERE = sa.text("outcome IS NULL AND lease_expires_at IS NOT NULL")
OLD = "ix_executions_outcome_lease_expires_at"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        _drop_leftover(OPEN_LEASES)
        op.create_index(
            OPEN_LEASES,
            "executions",
            ["lease_expires_at"],
            unique=False,
            postgresql_where=OPEN_LEASES_WHERE,
            sqlite_where=OPEN_LEASES_WHERE,
            postgresql_concurrently=True,
        )
        _drop(OLD)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _drop_leftover(OLD)
        op.create_index(
            OLD,
            "executions",
            ["outcome", "lease_expires_at"],
            unique=False,
            postgresql_concurrently=True,
        )
        _drop(OPEN_LEASES)


def _drop_leftover(name: str) -> None:
    """The index about to be built, if it exists already, can only be what an interrupted
    concurrent build left (Postgres keeps it, invalid): dropped, it is built anew."""
    if op.get_bind().dialect.name == "postgresql":
        _drop(name)


def _drop(name: str) -> None:
    # If it exists: a run interrupted after this drop, before the store was stamped, runs again.
    op.drop_index(name, table_name="executions", postgresql_concurrently=True, if_exists=True)
