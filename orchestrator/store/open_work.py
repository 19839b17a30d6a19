"""The task's writes the host cannot show finished, and what happens to them when a round or a
generation ends (DESIGN invariant 23).

A write receipt `running`, `unknown` or `pending` keeps its task from ending `completed`. When a
generation ends, for any reason, its session's `running` receipts become `unknown` with a fresh
token in the same transaction: no later finisher of the ended generation can overwrite that,
and operators see them at once instead of at the next cold start. A background command still
running at round end is stopped; its `pending` receipt becomes `unknown`, never left `pending`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, select, update

from orchestrator.domain.outcomes import Outcome, summary_for
from orchestrator.store.tables import executions
from orchestrator.store.tables import invocation_receipts as r
from orchestrator.store.types import utcnow

__all__ = [
    "OPEN_STATUSES",
    "generation_receipts_to_unknown",
    "open_writes",
    "settle_background",
]

#: Receipt states that keep a task from completing.
OPEN_STATUSES = ("running", "unknown", "pending")

_OPEN_WRITES = (
    select(r.c.tool_name, r.c.invocation_id, r.c.status)
    .where(r.c.owner == bindparam("owner"), r.c.status.in_(OPEN_STATUSES))
    .order_by(r.c.created_at, r.c.invocation_id)
    .limit(bindparam("limit"))
)

_SESSION_OF_GENERATION = (
    select(executions.c.session_id)
    .where(
        executions.c.task_id == bindparam("task_id"),
        executions.c.generation == bindparam("generation"),
    )
    .scalar_subquery()
)


_ENDED: dict[str, Outcome] = {"succeeded": "succeeded", "failed": "command_failed"}


def open_writes(conn: Connection, task_id: str, limit: int = 50) -> list[str]:
    """The task's open writes as "tool invocation_id (status)", oldest first."""
    rows = conn.execute(_OPEN_WRITES, {"owner": f"task:{task_id}", "limit": limit})
    return [f"{row.tool_name} {row.invocation_id} ({row.status})" for row in rows]


# Built once: every generation's end runs it.
_RUNNING_TO_UNKNOWN = (
    update(r)
    .where(r.c.session_id == _SESSION_OF_GENERATION, r.c.status == "running")
    .values(
        status="unknown",
        summary=summary_for("generation_ended"),
        claim_token=bindparam("ended_token"),
        updated_at=bindparam("ended_at"),
    )
)


def generation_receipts_to_unknown(conn: Connection, task_id: str, generation: int) -> int:
    """The ended generation's `running` receipts become `unknown` with a new token."""
    result = conn.execute(
        _RUNNING_TO_UNKNOWN,
        {
            "task_id": task_id,
            "generation": generation,
            "ended_token": f"ended-{uuid.uuid4().hex}",
            "ended_at": utcnow(),
        },
    )
    return int(result.rowcount)


def settle_background(
    conn: Connection, ended: Sequence[tuple[str, str]], reaped: Sequence[str]
) -> int:
    """Background commands at round end: `ended` (invocation_id, final status) take the status
    their end showed; `reaped` ones (still running, now stopped) become `unknown`. Only
    `pending` receipts change; returns how many did."""
    changed = 0
    now = utcnow()
    for invocation_id, status in ended:
        outcome = _ENDED.get(status, "indeterminate")
        changed += conn.execute(
            update(r)
            .where(r.c.invocation_id == invocation_id, r.c.status == "pending")
            .values(
                status=status if status in _ENDED else "unknown",
                summary=summary_for(outcome),
                updated_at=now,
            )
        ).rowcount
    if reaped:
        changed += conn.execute(
            update(r)
            .where(r.c.invocation_id.in_(list(reaped)), r.c.status == "pending")
            .values(status="unknown", summary=summary_for("reaped"), updated_at=now)
        ).rowcount
    return changed
