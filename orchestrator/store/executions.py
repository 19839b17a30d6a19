"""Execution rows as they are read: one generation's, a task's history, the sweeper's expired.

Reads only: recovery looks at the last generation that started, the API and the CLI show a
task's generations and which of them wait, handed back, for the sweeper, and the sweeper finds
the generations whose mirrored lease ran out. What changes an execution row is in
`orchestrator.store.generations`, and the claim that puts a lease on it in
`orchestrator.store.generation_claims`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, func, select

from orchestrator.store.records import ExecutionRecord
from orchestrator.store.tables import OPEN_LEASE, executions

__all__ = [
    "count_handed_back",
    "expired_executions",
    "get_execution",
    "handed_back",
    "last_started_execution",
    "list_executions",
]


def get_execution(conn: Connection, task_id: str, generation: int) -> ExecutionRecord | None:
    row = conn.execute(
        select(executions).where(
            executions.c.task_id == task_id, executions.c.generation == generation
        )
    ).one_or_none()
    return ExecutionRecord.from_row(row) if row is not None else None


def last_started_execution(
    conn: Connection, task_id: str, before_generation: int
) -> ExecutionRecord | None:
    """The latest generation below `before_generation` that actually started (has `started_at`).

    A generation superseded while still queued never ran and left nothing; it is skipped.
    """
    row = conn.execute(
        select(executions)
        .where(
            executions.c.task_id == task_id,
            executions.c.generation < before_generation,
            executions.c.started_at.is_not(None),
        )
        .order_by(executions.c.generation.desc())
        .limit(1)
    ).one_or_none()
    return ExecutionRecord.from_row(row) if row is not None else None


def list_executions(conn: Connection, task_id: str) -> list[ExecutionRecord]:
    rows = conn.execute(
        select(executions).where(executions.c.task_id == task_id).order_by(executions.c.generation)
    )
    return [ExecutionRecord.from_row(row) for row in rows]


def expired_executions(conn: Connection, now: datetime, limit: int) -> list[ExecutionRecord]:
    """Running generations whose mirrored lease ran out: an index range scan, oldest first."""
    rows = conn.execute(
        select(executions)
        .where(executions.c.outcome.is_(None), executions.c.lease_expires_at < now)
        .order_by(executions.c.lease_expires_at)
        .limit(limit)
    )
    return [ExecutionRecord.from_row(row) for row in rows]


def handed_back(conn: Connection, current: Sequence[tuple[str, int]]) -> dict[str, ExecutionRecord]:
    """Of these (task, current generation) pairs, the generations their worker handed back and
    the sweeper has not requeued yet, by task: the round stopped, nothing runs, and the task
    still reads `running` until the first sweep after `lease_expires_at` (a model server's
    Retry-After or back-off, or now after an outage)."""
    wanted = dict(current)
    if not wanted:
        return {}
    rows = conn.execute(
        select(executions).where(
            executions.c.task_id.in_(list(wanted)),
            executions.c.outcome.is_(None),
            executions.c.handed_back_at.is_not(None),
        )
    )
    return {
        row.task_id: ExecutionRecord.from_row(row)
        for row in rows
        if wanted.get(row.task_id) == row.generation
    }


def count_handed_back(conn: Connection) -> int:
    """How many open generations wait, handed back, for the sweeper: read from the index of
    the claimed open generations (a hand-back sets the lease's expiry, `OPEN_LEASE`), never
    the queued ones."""
    return int(
        conn.execute(
            select(func.count()).where(OPEN_LEASE, executions.c.handed_back_at.is_not(None))
        ).scalar_one()
    )
