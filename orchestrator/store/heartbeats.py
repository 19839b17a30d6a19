"""The lease mirror of many generations in one statement: what one process heartbeat writes.

The sweeper finds expired leases through the store's copy of each lease's expiry. A worker
process renews all its leases together, so it mirrors them together too; a generation the
store no longer has open (cancelled, requeued, lost) is missing from the answer. The same beat
asks, for a renewal the lease back end refused, whether the store still has that generation
open under its token (`held_open`), in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, select, tuple_, update

from orchestrator.store.tables import executions

__all__ = ["held_open", "mirror_leases"]


def mirror_leases(
    conn: Connection, held: Sequence[tuple[str, int, str]], expires_at: datetime
) -> set[tuple[str, int]]:
    """Set `expires_at` on each open (task, generation, lease token); the ones still open."""
    if not held:
        return set()
    rows = conn.execute(
        update(executions)
        .where(
            tuple_(executions.c.task_id, executions.c.generation, executions.c.lease_token).in_(
                list(held)
            ),
            executions.c.outcome.is_(None),
        )
        .values(lease_expires_at=expires_at)
        .returning(executions.c.task_id, executions.c.generation)
    )
    return {(row.task_id, row.generation) for row in rows}


def held_open(conn: Connection, held: Sequence[tuple[str, int, str]]) -> set[tuple[str, int]]:
    """Of the (task, generation, lease token), those the store has open under that token: a
    renewal refused for one of them met another holder of the lease for the moment, not a
    generation that ended (`services/lease_keeper.py`)."""
    if not held:
        return set()
    rows = conn.execute(
        select(executions.c.task_id, executions.c.generation).where(
            tuple_(executions.c.task_id, executions.c.generation, executions.c.lease_token).in_(
                list(held)
            ),
            executions.c.outcome.is_(None),
        )
    )
    return {(row.task_id, row.generation) for row in rows}
