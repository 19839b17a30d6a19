"""The life of an execution generation: opened, claimed, kept, handed back, ended, requeued.

A generation is one run of a task: its session and execution row are opened with it, a worker
claims it (queued → running) with a lease token (`orchestrator.store.generation_claims`),
mirrors each lease renewal into the execution row (the sweeper's index), and it ends with an
outcome, the task settled or moved on to the next generation. Every step is a compare-and-set on
the task or execution row, so of two writers the second finds the row moved and does nothing.
Functions take a `Connection`; the service that calls them owns the transaction, so a check and
the write it guards always commit together.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, insert, select, update

from orchestrator.store import action_notices as notice_store
from orchestrator.store import actions as action_store
from orchestrator.store import driver
from orchestrator.store.open_work import generation_receipts_to_unknown
from orchestrator.store.records import driver_row
from orchestrator.store.tables import actions, executions, sessions, tasks
from orchestrator.store.types import utcnow

__all__ = [
    "GENERATION_COLUMNS",
    "end_and_settle",
    "end_generation",
    "generation_rows",
    "hand_back",
    "mirror_lease",
    "new_id",
    "open_generation",
    "requeue_generation",
    "session_title",
    "supersede_pending_actions",
]


#: `sessions.title` is String(200).
SESSION_TITLE_MAX = 200


def new_id() -> str:
    """A new session or execution id."""
    return str(uuid.uuid4())


def open_generation(
    conn: Connection, task_id: str, generation: int, title: str, now: datetime
) -> str:
    """The session and execution row of a new generation; points the task at the session."""
    session_id = new_id()
    _insert_generation(conn, task_id, generation, title, session_id, now)
    conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(session_id=session_id))
    return session_id


def _insert_generation(
    conn: Connection, task_id: str, generation: int, title: str, session_id: str, now: datetime
) -> None:
    session_row, execution_row = generation_rows(task_id, generation, title, session_id, now)
    conn.execute(insert(sessions).values(session_row))
    conn.execute(insert(executions).values(execution_row))


#: The columns `generation_rows` fills, per row.
GENERATION_COLUMNS = {
    "session": [
        "session_id",
        "purpose",
        "task_id",
        "generation",
        "owner",
        "title",
        "created_at",
        "updated_at",
    ],
    "execution": ["task_id", "generation", "session_id", "created_at"],
}


def generation_rows(
    task_id: str, generation: int, title: str, session_id: str, now: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The session row (purpose `task_execution`) and execution row of one generation."""
    session = {
        "session_id": session_id,
        "purpose": "task_execution",
        "task_id": task_id,
        "generation": generation,
        "owner": f"task:{task_id}",
        "title": session_title(title, generation),
        "created_at": now,
        "updated_at": now,
    }
    execution = {
        "task_id": task_id,
        "generation": generation,
        "session_id": session_id,
        "created_at": now,
    }
    return session, execution


def session_title(title: str, generation: int) -> str:
    """The title of a generation's session, cut to fit the column."""
    suffix = f" (generation {generation})"
    return title[: SESSION_TITLE_MAX - len(suffix)] + suffix


def mirror_lease(
    conn: Connection, task_id: str, generation: int, lease_token: str, expires_at: datetime
) -> bool:
    """Record a renewal in the store (the sweeper's index); False when the generation is over."""
    return (
        conn.execute(
            update(executions)
            .where(*_held_open(task_id, generation, lease_token))
            .values(lease_expires_at=expires_at)
        ).rowcount
        == 1
    )


def _held_open(task_id: str, generation: int, lease_token: str) -> list[ColumnElement[bool]]:
    """The execution row of this generation while it is open and `lease_token` holds it."""
    return [
        executions.c.task_id == task_id,
        executions.c.generation == generation,
        executions.c.lease_token == lease_token,
        executions.c.outcome.is_(None),
    ]


def hand_back(
    conn: Connection,
    task_id: str,
    generation: int,
    lease_token: str,
    *,
    outage: bool = True,
    after: float = 0.0,
    reason: str | None = None,
) -> bool:
    """A worker gives back the generation its round stopped: the mirrored lease ends now, or
    `after` seconds from now (a model server's Retry-After; the next sweep past it requeues
    it), and, when an outage stopped it, `handed_back_at` says so, with `reason` as the
    execution's reason when given (the sweep keeps it); fenced as a renewal is; False when the
    generation is over or another token holds it."""
    now = utcnow()
    marked: dict[str, Any] = {"handed_back_at": now} if outage else {}
    if reason is not None:
        marked["reason"] = reason
    return (
        conn.execute(
            update(executions)
            .where(*_held_open(task_id, generation, lease_token))
            .values(lease_expires_at=now + timedelta(seconds=max(0.0, after)), **marked)
        ).rowcount
        == 1
    )


def end_generation(
    conn: Connection,
    task_id: str,
    generation: int,
    *,
    outcome: str,
    reason: str,
    failure_code: str | None = None,
) -> bool:
    """Close one generation's execution row if it is still open; its `running` receipts
    become `unknown` in the same transaction (invariant 23)."""
    params = _end_params(task_id, generation, outcome, reason, failure_code, utcnow())
    closed = conn.execute(_END_GENERATION, params).rowcount == 1
    if closed:
        generation_receipts_to_unknown(conn, task_id, generation)
    return closed


def _end_params(
    task_id: str,
    generation: int,
    outcome: str,
    reason: str,
    failure_code: str | None,
    at: datetime,
) -> dict[str, Any]:
    return {
        "end_task_id": task_id,
        "end_generation": generation,
        "end_outcome": outcome,
        "end_reason": reason,
        "end_failure_code": failure_code,
        "end_at": at,
    }


# Built once: every generation ends through it (bound names differ from the columns, which an
# UPDATE reserves for its SET clause).
_END_GENERATION = (
    update(executions)
    .where(
        executions.c.task_id == bindparam("end_task_id"),
        executions.c.generation == bindparam("end_generation"),
        executions.c.outcome.is_(None),
    )
    .values(
        outcome=bindparam("end_outcome"),
        reason=bindparam("end_reason"),
        failure_code=bindparam("end_failure_code"),
        ended_at=bindparam("end_at", type_=executions.c.ended_at.type),
    )
)


def _settle_params(
    task_id: str,
    generation: int,
    status: str,
    failure_code: str | None,
    last_error: str | None,
    rounds: int,
    at: datetime,
) -> dict[str, Any]:
    return {
        "settle_task_id": task_id,
        "settle_generation": generation,
        "settle_status": status,
        "settle_failure_code": failure_code,
        "settle_last_error": last_error,
        "settle_rounds": rounds,
        "settle_at": at,
    }


_SETTLE_TASK = (
    update(tasks)
    .where(
        tasks.c.task_id == bindparam("settle_task_id"),
        tasks.c.generation == bindparam("settle_generation"),
    )
    .values(
        status=bindparam("settle_status"),
        failure_code=bindparam("settle_failure_code"),
        last_error=bindparam("settle_last_error"),
        recoveries=0,
        handbacks=0,
        rounds=bindparam("settle_rounds"),
        updated_at=bindparam("settle_at", type_=tasks.c.updated_at.type),
    )
)


def end_and_settle(
    conn: Connection,
    task_id: str,
    generation: int,
    *,
    outcome: str,
    reason: str,
    failure_code: str | None,
    status: str,
    last_error: str | None,
    rounds: int,
    supersede_note: str | None = None,
) -> None:
    """Close the generation's execution row if it is still open, and set the task's status
    after the round (no next generation queued): one statement on Postgres. With
    `supersede_note` (the task is finished), its pending actions are superseded in it too."""
    at = utcnow()
    ended = _end_params(task_id, generation, outcome, reason, failure_code, at)
    settled = _settle_params(task_id, generation, status, failure_code, last_error, rounds, at)
    if conn.dialect.name == "postgresql":
        if supersede_note is None:
            driver.fetch(conn, _END_AND_SETTLE, {**ended, **settled})
        else:
            superseded = {"supersede_task_id": task_id, "supersede_note": supersede_note}
            rows = driver.fetch(conn, _END_SETTLE_AND_SUPERSEDE, {**ended, **settled, **superseded})
            # Their notices cost statements only when there were some.
            actions_superseded = [driver_row(_ACTION_COLUMNS, row) for row in rows]
            notice_store.record_superseded(
                conn, action_store.superseded_from_rows(actions_superseded)
            )
    else:  # SQLite has no data-modifying WITH
        conn.execute(_END_GENERATION, ended)
        conn.execute(_SETTLE_TASK, settled)
        if supersede_note is not None:
            supersede_pending_actions(conn, task_id, supersede_note)
    generation_receipts_to_unknown(conn, task_id, generation)


# Postgres runs a data-modifying WITH whether or not the main statement reads it.
_ENDED_EXECUTION = _END_GENERATION.returning(executions.c.task_id).cte("ended_execution")
_END_AND_SETTLE = _SETTLE_TASK.add_cte(_ENDED_EXECUTION)
_SUPERSEDED_ACTIONS = (
    update(actions)
    .where(
        actions.c.task_id == bindparam("supersede_task_id"),
        actions.c.status == "pending_approval",
    )
    .values(status="superseded", note=bindparam("supersede_note"))
    .returning(*actions.c)
    .cte("superseded_actions")
)
# The same, reading the actions it superseded: their rows are what the statement returns
# (whether or not the task row matched), so each gets its notice without another read.
_END_SETTLE_AND_SUPERSEDE = (
    select(_SUPERSEDED_ACTIONS)
    .add_cte(_ENDED_EXECUTION)
    .add_cte(_SETTLE_TASK.returning(tasks.c.task_id).cte("settled_task"))
)
_ACTION_COLUMNS = tuple(column.name for column in actions.c)  # as superseded ones come back


def requeue_generation(
    conn: Connection,
    task_id: str,
    generation: int,
    *,
    title: str,
    from_statuses: tuple[str, ...],
    recoveries: int,
    rounds: int,
    new_intent: bool = False,
) -> int | None:
    """Compare-and-set generation n → n+1 (queued); None when someone else moved the task first.

    `new_intent` (an operator's requeue) starts a new intent round: finished writes of the
    earlier round may run again. Recovery and continuation keep the round.
    """
    now = utcnow()
    nxt = generation + 1
    moved = conn.execute(
        update(tasks)
        .where(
            tasks.c.task_id == task_id,
            tasks.c.generation == generation,
            tasks.c.status.in_(from_statuses),
        )
        .values(
            generation=nxt,
            status="queued",
            queued_at=now,
            updated_at=now,
            recoveries=recoveries,
            handbacks=0,
            rounds=rounds,
            failure_code=None,
            intent_round=tasks.c.intent_round + 1 if new_intent else tasks.c.intent_round,
        )
    ).rowcount
    if moved != 1:
        return None
    open_generation(conn, task_id, nxt, title, now)
    return nxt


def supersede_pending_actions(conn: Connection, task_id: str, note: str) -> int:
    """The task's pending actions are superseded, each with its `action_superseded` event and
    webhook, in the caller's transaction (which holds the task row's lock)."""
    superseded = action_store.supersede_task_actions(conn, task_id, note)
    notice_store.record_superseded(conn, superseded)
    return len(superseded)
