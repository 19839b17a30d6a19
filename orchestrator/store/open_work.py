"""The task's writes the host cannot show finished, and what happens to them when a round or a
generation ends (DESIGN invariant 23).

A write receipt `running`, `unknown` or `pending` keeps its task from ending `completed`. When a
generation ends, for any reason, its session's `running` receipts become `unknown` with a fresh
token in the same transaction: no later finisher of the ended generation can overwrite that,
and operators see them at once instead of at the next cold start. A background command still
running at round end is stopped; its `pending` receipt becomes `unknown`, never left `pending`.
An operator may settle an `unknown` or `pending` write as `succeeded` or `failed`
(`resolve_open_write`), a compare-and-set on the status; nothing else is ever changed by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ARRAY, Connection, Row, Select, String, any_, bindparam, select, update

from orchestrator.domain.outcomes import Outcome, summary_for
from orchestrator.store import driver
from orchestrator.store.tables import executions
from orchestrator.store.tables import invocation_receipts as r
from orchestrator.store.types import utcnow

__all__ = [
    "OPEN_STATUSES",
    "RESOLUTIONS",
    "RESOLVABLE",
    "generation_receipts_to_unknown",
    "open_writes",
    "receipt_row",
    "resolve_open_write",
    "settle_background",
    "task_of_owner",
]

#: Receipt states that keep a task from completing.
OPEN_STATUSES = ("running", "unknown", "pending")


def _open_writes(open_status: Any) -> Select[Any]:
    return (
        select(r.c.tool_name, r.c.invocation_id, r.c.status)
        .where(r.c.owner == bindparam("owner"), open_status)
        .order_by(r.c.created_at, r.c.invocation_id)
        .limit(bindparam("limit"))
    )


_OPEN_WRITES = _open_writes(r.c.status.in_(OPEN_STATUSES))
# Postgres, sent by store.driver: the statuses as one array the statement carries.
_OPEN_WRITES_ANY = _open_writes(
    r.c.status == any_(bindparam("open", value=list(OPEN_STATUSES), type_=ARRAY(String)))
)

_SESSION_OF_GENERATION = (
    select(executions.c.session_id)
    .where(
        executions.c.task_id == bindparam("task_id"),
        executions.c.generation == bindparam("generation"),
    )
    .scalar_subquery()
)


#: What an operator may resolve (a `running` write is still in someone's hands), and into what.
#: A `succeeded` receipt is final: a completed node may cite it, so it never becomes `failed`.
RESOLVABLE = ("unknown", "pending")
RESOLUTIONS = ("succeeded", "failed")

_ENDED: dict[str, Outcome] = {"succeeded": "succeeded", "failed": "command_failed"}


def open_writes(conn: Connection, task_id: str, limit: int = 50) -> list[str]:
    """The task's open writes as "tool invocation_id (status)", oldest first."""
    statement = _OPEN_WRITES_ANY if conn.dialect.name == "postgresql" else _OPEN_WRITES
    rows = driver.fetch(conn, statement, {"owner": f"task:{task_id}", "limit": limit})
    return [f"{tool_name} {invocation_id} ({status})" for tool_name, invocation_id, status in rows]


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
    .returning(r.c.invocation_id)  # one row each: how many changed
)


def generation_receipts_to_unknown(conn: Connection, task_id: str, generation: int) -> int:
    """The ended generation's `running` receipts become `unknown` with a new token."""
    changed = driver.fetch(
        conn,
        _RUNNING_TO_UNKNOWN,
        {
            "task_id": task_id,
            "generation": generation,
            "ended_token": f"ended-{uuid.uuid4().hex}",
            "ended_at": utcnow(),
        },
    )
    return len(changed)


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


def task_of_owner(owner: str) -> str | None:
    """The task id of a task's receipt owner (`task:<id>`), None for any other owner."""
    prefix, _, task_id = owner.partition(":")
    return task_id if prefix == "task" and task_id else None


def receipt_row(conn: Connection, invocation_id: str, *, lock: bool = False) -> Row[Any] | None:
    """The receipt row; with `lock`, locked until the end of the transaction (Postgres;
    SQLite's write transaction already excludes every other writer)."""
    query = select(r).where(r.c.invocation_id == invocation_id)
    return conn.execute(query.with_for_update() if lock else query).one_or_none()


def resolve_open_write(conn: Connection, invocation_id: str, previous: str, status: str) -> bool:
    """An operator's resolution: `previous` (`unknown` or `pending`) becomes `status`
    (`succeeded` or `failed`) only if the receipt is still in `previous`. The claim token
    rotates, so no finisher or verifier holding the old one can overwrite it. False when the
    status had changed."""
    if previous not in RESOLVABLE or status not in RESOLUTIONS:
        raise ValueError(f"cannot resolve {previous} as {status}")
    result = conn.execute(
        update(r)
        .where(r.c.invocation_id == invocation_id, r.c.status == previous)
        .values(
            status=status,
            summary=summary_for(
                "resolved_succeeded" if status == "succeeded" else "resolved_failed"
            ),
            claim_token=f"resolved-{uuid.uuid4().hex}",
            updated_at=utcnow(),
        )
    )
    return result.rowcount == 1
