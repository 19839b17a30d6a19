"""The task event log, and the webhook each reported event is delivered by (DESIGN section 8).

`task_events` is each task's ordered log. `seq` is 1, 2, 3... per task, allocated while the
task row is locked, so seq order is commit order: the task stream's durable event ids. An
event whose type is one of `WEBHOOK_EVENTS` gets its webhook row in the outbox in the same
statements, its body frozen then, so every retry sends the same bytes. Every producer calls
these inside the transaction of the change it reports; the deliveries themselves (claims,
attempts, retries) are `orchestrator.store.outbox` and the modules beside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Insert,
    Integer,
    Row,
    bindparam,
    func,
    insert,
    select,
    text,
)

from orchestrator.domain.times import wire_time
from orchestrator.store import driver
from orchestrator.store.db import wake_after_commit
from orchestrator.store.tables import outbox, task_events, tasks
from orchestrator.store.types import utcnow

__all__ = [
    "WEBHOOK_EVENTS",
    "NewEvent",
    "TaskEvent",
    "event_json",
    "events_after",
    "events_of_type",
    "last_seq",
    "record_event",
    "record_events",
    "task_wake_key",
    "webhook_body",
]

#: Task events the business backend hears of by webhook; the others feed the task stream only.
WEBHOOK_EVENTS: Final = (
    "waiting",
    "completed",
    "failed",
    "cancelled",
    "action_proposed",
    "action_decided",
    "action_superseded",
    "action_task_cancelled",
)


@dataclass(frozen=True)
class TaskEvent:
    task_id: str
    seq: int
    type: str
    generation: int
    status: str
    reason: str | None
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any]) -> TaskEvent:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    @property
    def event_id(self) -> str:
        """The webhook's event id: stable across retries, unique across tasks."""
        return f"{self.task_id}:{self.seq}"


def event_json(value: Any) -> str:
    """The canonical JSON text of an event's data or webhook body (sorted keys, compact)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _lock_task(conn: Connection, task_id: str) -> None:
    conn.execute(select(tasks.c.task_id).where(tasks.c.task_id == task_id).with_for_update())


def record_event(
    conn: Connection,
    task_id: str,
    event_type: str,
    *,
    generation: int | None = None,
    status: str | None = None,
    reason: str | None = None,
    data: dict[str, Any] | None = None,
    task_locked: bool = False,
) -> TaskEvent:
    """Append one event to the task's log, and its webhook when the type is one of
    `WEBHOOK_EVENTS`. The seq is the next one in commit order because the task row is locked
    until the commit: pass `task_locked=True` only when the caller's transaction already holds
    that lock (a fence check does). `generation` and `status` default to the task row's.
    One statement (two with a webhook)."""
    if not task_locked:
        _lock_task(conn, task_id)
    spec = NewEvent(task_id, event_type, generation, status, reason, data)
    (event,) = record_events(conn, [spec])
    return event


@dataclass(frozen=True)
class NewEvent:
    """One event to append with `record_events`."""

    task_id: str
    type: str
    generation: int | None = None
    status: str | None = None
    reason: str | None = None
    data: dict[str, Any] | None = None


def task_wake_key(task_id: str) -> str:
    """What a committed event of `task_id` announces, and what its task streams wait on."""
    return f"task:{task_id}"


def record_events(conn: Connection, events: Sequence[NewEvent]) -> list[TaskEvent]:
    """Append events to tasks whose rows the caller's transaction has locked: one INSERT for
    a batch of distinct tasks, and one more for their webhooks (a sweep's batch of requeues).

    Every row's seq is read from the log as it was before its INSERT, so a task's second
    event goes in a later INSERT of its own.
    """
    if not events:
        return []
    first: dict[str, NewEvent] = {}
    later: list[NewEvent] = []
    for event in events:
        if event.task_id in first:
            later.append(event)
        else:
            first[event.task_id] = event
    return _record_distinct(conn, list(first.values())) + record_events(conn, later)


def _record_distinct(conn: Connection, events: Sequence[NewEvent]) -> list[TaskEvent]:
    now = utcnow()
    if conn.dialect.name == "postgresql" and len(events) > 1:
        # One fixed statement over arrays: prepared once, whatever the batch size.
        returned = conn.execute(
            _PG_EVENTS,
            {
                "task_ids": [event.task_id for event in events],
                "types": [event.type for event in events],
                "generations": [event.generation for event in events],
                "statuses": [event.status for event in events],
                "reasons": [event.reason for event in events],
                "datas": [json.dumps(event.data or {}) for event in events],
                "now": now,
            },
        ).all()
        order = {event.task_id: number for number, event in enumerate(events)}
        recorded = [
            TaskEvent.from_row(row) for row in sorted(returned, key=lambda row: order[row.task_id])
        ]
    elif conn.dialect.name == "postgresql":
        # One event (the end of a round, a publish): sent by the driver, and only what the
        # INSERT read itself comes back.
        (one,) = events
        ((seq, generation, status),) = driver.fetch(
            conn,
            _insert_one_event(),
            {
                "ev_task_id": one.task_id,
                "ev_type": one.type,
                "ev_generation": one.generation,
                "ev_status": one.status,
                "ev_reason": one.reason,
                "ev_data": json.dumps(one.data or {}),
                "ev_created_at": now,
            },
        )
        recorded = [
            TaskEvent(
                one.task_id, seq, one.type, generation, status, one.reason,
                one.data or {}, now,
            )
        ]  # fmt: skip
    else:
        params = [
            {
                "ev_task_id": event.task_id,
                "ev_type": event.type,
                "ev_generation": event.generation,
                "ev_status": event.status,
                "ev_reason": event.reason,
                "ev_data": event.data or {},
                "ev_created_at": now,
            }
            for event in events
        ]
        # One event is one execution, not an executemany: SQLAlchemy's "insertmanyvalues"
        # batching of a list costs more CPU than the statement itself.
        rows = list(conn.execute(_insert_event(), params[0] if len(params) == 1 else params))
        recorded = [TaskEvent.from_row(row) for row in rows]
    for event in recorded:  # the task streams that follow these tasks, once committed
        wake_after_commit(conn, task_wake_key(event.task_id))
    webhooks = [
        {
            "kind": "webhook",
            "task_id": event.task_id,
            "event_seq": event.seq,
            "body": event_json(webhook_body(event)),
            "status": "pending",
            "attempts": 0,
            "throttled": 0,
            "next_attempt_at": now,
            "created_at": now,
        }
        for event in recorded
        if event.type in WEBHOOK_EVENTS
    ]
    if len(webhooks) == 1 and conn.dialect.name == "postgresql":
        driver.fetch(conn, _INSERT_ONE_WEBHOOK, webhooks[0])
    elif webhooks:
        conn.execute(_INSERT_OUTBOX, webhooks[0] if len(webhooks) == 1 else webhooks)
    return recorded


#: Built once: a statement built per call costs more to construct and key than to send.
_INSERT_OUTBOX = insert(outbox)
_WEBHOOK_COLUMNS = (
    "kind", "task_id", "event_seq", "body", "status", "attempts", "throttled", "next_attempt_at",
    "created_at",
)  # fmt: skip
_INSERT_ONE_WEBHOOK = insert(outbox).values({name: bindparam(name) for name in _WEBHOOK_COLUMNS})


@cache
def _insert_event() -> Insert:
    """Built once (compiled once): the next seq, and the task's generation and status unless
    given, are read in the INSERT itself, one round trip."""
    return _event_values().returning(*task_events.c)


@cache
def _insert_one_event() -> Insert:
    """`_insert_event` returning only what the INSERT read itself (the rest is the caller's)."""
    return _event_values().returning(
        task_events.c.seq, task_events.c.generation, task_events.c.status
    )


def _event_values() -> Insert:

    def of_task(column: Any) -> Any:
        return select(column).where(tasks.c.task_id == bindparam("ev_task_id")).scalar_subquery()

    next_seq = (
        select(func.coalesce(func.max(task_events.c.seq), 0) + 1)
        .where(task_events.c.task_id == bindparam("ev_task_id"))
        .scalar_subquery()
    )
    return insert(task_events).values(
        task_id=bindparam("ev_task_id"),
        seq=next_seq,
        type=bindparam("ev_type"),
        generation=func.coalesce(
            bindparam("ev_generation", type_=Integer), of_task(tasks.c.generation)
        ),
        status=func.coalesce(
            bindparam("ev_status", type_=task_events.c.status.type), of_task(tasks.c.status)
        ),
        reason=bindparam("ev_reason", type_=task_events.c.reason.type),
        data=bindparam("ev_data", type_=task_events.c.data.type),
        created_at=bindparam("ev_created_at", type_=task_events.c.created_at.type),
    )


# Postgres: `_insert_event` for a batch of distinct tasks, in one statement over arrays.
_PG_EVENTS = (
    text(
        """
        INSERT INTO task_events (task_id, seq, type, generation, status, reason, data, created_at)
        SELECT n.task_id,
               coalesce((SELECT max(e.seq) FROM task_events e WHERE e.task_id = n.task_id), 0) + 1,
               n.type, coalesce(n.generation, t.generation), coalesce(n.status, t.status),
               n.reason, n.data, :now
        FROM unnest(
            CAST(:task_ids AS text[]), CAST(:types AS text[]), CAST(:generations AS integer[]),
            CAST(:statuses AS text[]), CAST(:reasons AS text[]), CAST(:datas AS jsonb[])
        ) AS n (task_id, type, generation, status, reason, data)
        JOIN tasks t ON t.task_id = n.task_id
        RETURNING task_id, seq, type, generation, status, reason, data, created_at
        """
    )
    .bindparams(bindparam("now", type_=task_events.c.created_at.type))
    .columns(*task_events.c)
)


def webhook_body(event: TaskEvent) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_id": event.event_id,
        "task_id": event.task_id,
        "seq": event.seq,
        "type": event.type,
        "status": event.status,
        "generation": event.generation,
        "reason": event.reason,
        "time": wire_time(event.created_at),
    }
    if "action" in event.data:
        body["action"] = event.data["action"]
    return body


def last_seq(conn: Connection, task_id: str) -> int:
    return int(
        conn.execute(
            select(func.coalesce(func.max(task_events.c.seq), 0)).where(
                task_events.c.task_id == task_id
            )
        ).scalar_one()
    )


def events_after(conn: Connection, task_id: str, after: int, limit: int) -> list[TaskEvent]:
    rows = conn.execute(
        select(task_events)
        .where(task_events.c.task_id == task_id, task_events.c.seq > after)
        .order_by(task_events.c.seq)
        .limit(limit)
    )
    return [TaskEvent.from_row(row) for row in rows]


def events_of_type(conn: Connection, task_id: str, type_: str, limit: int) -> list[TaskEvent]:
    """The task's newest `limit` events of one type, oldest first."""
    rows = conn.execute(
        select(task_events)
        .where(task_events.c.task_id == task_id, task_events.c.type == type_)
        .order_by(task_events.c.seq.desc())
        .limit(limit)
    )
    return [TaskEvent.from_row(row) for row in reversed(rows.all())]
