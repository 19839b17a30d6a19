"""The outbox: what must reach the business backend, written with the change it reports.

Two records (DESIGN section 8, invariant 24):
- `task_events`, each task's ordered log. `seq` is 1, 2, 3... per task, allocated while the
  task row is locked, so seq order is commit order: the task stream's durable event ids.
- `outbox`, the deliveries: an approved action (one row per approval, unique on the action id)
  and a webhook per reported task event. The body is frozen when the row is written, so every
  retry sends the same bytes.

Every producer calls these inside the transaction of the change it reports; the dispatcher
(`orchestrator.services.outbox`) claims due rows, sends them outside any transaction, and
records the result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Insert,
    Integer,
    Row,
    and_,
    bindparam,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)

from orchestrator.store import driver
from orchestrator.store.actions import ActionRecord
from orchestrator.store.db import wake_after_commit
from orchestrator.store.tables import actions, outbox, task_events, tasks
from orchestrator.store.types import utcnow

__all__ = [
    "WEBHOOK_EVENTS",
    "NewEvent",
    "OutboxRow",
    "TaskEvent",
    "claim_due",
    "delivery_summary",
    "events_after",
    "events_of_type",
    "get_row",
    "last_seq",
    "list_rows",
    "lock_task_of_action",
    "mark_delivered",
    "mark_failed",
    "record_cancelled_approvals",
    "record_decision",
    "record_event",
    "record_events",
    "record_proposal",
    "record_superseded",
    "renew_claim",
    "retry_dead",
    "task_wake_key",
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


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: int
    kind: str
    task_id: str
    event_seq: int | None
    action_id: str | None
    body: str
    status: str
    attempts: int  # claims so far (each claim's compare-and-set token)
    throttled: int  # of the attempts, those answered 429 (not counted toward the limit)
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None

    @classmethod
    def from_row(cls, row: Row[Any]) -> OutboxRow:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    @property
    def counted(self) -> int:
        """The attempts that count toward a webhook's ORCH_WEBHOOK_MAX_ATTEMPTS: the ones the
        backend did not throttle (a claim whose send never reported, its dispatcher killed,
        counts)."""
        return self.attempts - self.throttled

    def public(self) -> dict[str, Any]:
        """What the API and `tasks show` print (the body is the backend's, shown parsed)."""
        view = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "body"}
        view["event_id"] = f"{self.task_id}:{self.event_seq}" if self.event_seq else None
        return view


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _lock_task(conn: Connection, task_id: str) -> None:
    conn.execute(select(tasks.c.task_id).where(tasks.c.task_id == task_id).with_for_update())


def lock_task_of_action(conn: Connection, action_id: str) -> None:
    """Lock the task row of an action before the action row: the order every writer that
    touches both uses (fence check, then actions), so a decision cannot deadlock a requeue."""
    task_id = conn.execute(
        select(actions.c.task_id).where(actions.c.action_id == action_id)
    ).scalar_one_or_none()
    if task_id is not None:
        _lock_task(conn, str(task_id))


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
            "body": _dumps(webhook_body(event)),
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
        "time": event.created_at.isoformat(),
    }
    if "action" in event.data:
        body["action"] = event.data["action"]
    return body


def _action_view(action: ActionRecord) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "kind": action.kind,
        "node_id": action.node_id,
        "generation": action.generation,
        "status": action.status,
        "decided_by": action.decided_by,
        "note": action.note,
    }


def record_proposal(conn: Connection, action: ActionRecord) -> TaskEvent:
    """`action_proposed`, in the transaction that stores the proposal."""
    return record_event(
        conn,
        action.task_id,
        "action_proposed",
        reason=f"{action.kind} proposed for node {action.node_id}",
        data={"action": _action_view(action)},
    )


def record_decision(conn: Connection, action: ActionRecord) -> TaskEvent:
    """`action_decided` and, for an approval, the action's delivery: in the transaction that
    decides it, so an approval without its delivery (or the reverse) never commits."""
    event = record_event(
        conn,
        action.task_id,
        "action_decided",
        reason=f"{action.kind} {action.action_id} {action.status} by {action.decided_by}",
        data={"action": _action_view(action)},
    )
    if action.status == "approved":
        now = utcnow()
        body = {
            "action_id": action.action_id,
            "kind": action.kind,
            "payload": action.payload,
            "task_id": action.task_id,
            "node_id": action.node_id,
            "generation": action.generation,
            "approver": action.decided_by,
            "note": action.note,
            "approved_at": (action.decided_at or now).isoformat(),
        }
        conn.execute(
            insert(outbox).values(
                kind="action",
                task_id=action.task_id,
                action_id=action.action_id,
                body=_dumps(body),
                status="pending",
                attempts=0,
                throttled=0,
                next_attempt_at=now,
                created_at=now,
            )
        )
    return event


def record_superseded(conn: Connection, superseded: Sequence[ActionRecord]) -> list[TaskEvent]:
    """`action_superseded` for each action, in the transaction that superseded them (the caller
    holds their tasks' row locks): a backend that heard `action_proposed` hears it went away.
    Nothing, not even a statement, when nothing was superseded."""
    return record_events(
        conn,
        [
            NewEvent(
                action.task_id,
                "action_superseded",
                generation=action.generation,
                reason=f"{action.kind} {action.action_id} superseded: {action.note}",
                data={"action": _action_view(action)},
            )
            for action in superseded
        ],
    )


def record_cancelled_approvals(conn: Connection, task_id: str, reason: str) -> list[TaskEvent]:
    """`action_task_cancelled` for each approved action of a task being cancelled (the caller
    holds its row lock), with where its delivery stands. A cancel does not take an approval
    back (its work order may be on its way or done): the backend decides what to withdraw."""
    rows = conn.execute(
        select(actions, outbox.c.status.label("delivery"))
        .select_from(
            actions.outerjoin(
                outbox, and_(outbox.c.action_id == actions.c.action_id, outbox.c.kind == "action")
            )
        )
        .where(actions.c.task_id == task_id, actions.c.status == "approved")
        .order_by(actions.c.decided_at, actions.c.action_id)
    ).all()
    return record_events(
        conn,
        [
            NewEvent(
                task_id,
                "action_task_cancelled",
                generation=row.generation,
                reason=(
                    f"the task was cancelled after {row.kind} {row.action_id} was approved by "
                    f"{row.decided_by}: {reason}"
                ),
                data={
                    "action": {
                        **_action_view(ActionRecord.from_row(row)),
                        "delivery": row.delivery or "none",
                    }
                },
            )
            for row in rows
        ],
    )


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


def claim_due(
    conn: Connection, kinds: tuple[str, ...], *, limit: int, hold_seconds: float
) -> list[OutboxRow]:
    """Due rows of `kinds`, each held for `hold_seconds` with its attempt counted.

    A webhook is due only when every earlier event of its task was delivered (in order per
    task; a dead one holds the later ones back until an operator retries it). The hold is
    committed before anything is sent: a dispatcher killed mid-send leaves the row due again
    once the hold runs out, never lost. Postgres: `FOR UPDATE SKIP LOCKED`, so dispatchers
    share the work; SQLite: the write transaction is exclusive anyway.
    """
    if not kinds:
        return []
    now = utcnow()
    earlier = outbox.alias("earlier")
    held_back = exists().where(
        earlier.c.task_id == outbox.c.task_id,
        earlier.c.kind == "webhook",
        earlier.c.status != "delivered",
        earlier.c.event_seq < outbox.c.event_seq,
    )
    query = (
        select(outbox)
        .where(
            outbox.c.status == "pending",
            outbox.c.next_attempt_at <= now,
            outbox.c.kind.in_(kinds),
            or_(outbox.c.kind == "action", ~held_back),
        )
        .order_by(outbox.c.next_attempt_at, outbox.c.outbox_id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True, of=outbox)
    rows = [OutboxRow.from_row(row) for row in conn.execute(query)]
    if not rows:
        return []
    until = now + timedelta(seconds=hold_seconds)
    conn.execute(
        update(outbox)
        .where(outbox.c.outbox_id.in_([row.outbox_id for row in rows]))
        .values(attempts=outbox.c.attempts + 1, next_attempt_at=until)
    )
    return [
        OutboxRow(**{**row.__dict__, "attempts": row.attempts + 1, "next_attempt_at": until})
        for row in rows
    ]


def renew_claim(conn: Connection, row: OutboxRow, *, hold_seconds: float) -> bool:
    """Hold the claimed `row` again, from now, just before it is sent (a batch is sent one row
    after another, and a later row's hold may run out meanwhile). False when the row is no
    longer this claim's: another dispatcher claimed it since (compare-and-set on the attempt
    count), or it is no longer pending; then it must not be sent."""
    return _update_claim(conn, row, next_attempt_at=utcnow() + timedelta(seconds=hold_seconds))


def release_claim(conn: Connection, row: OutboxRow) -> bool:
    """Give back a claimed `row` that was not sent (its dispatcher is stopping): due again now,
    its attempt not counted. False when the row is no longer this claim's (as `renew_claim`)."""
    return _update_claim(conn, row, attempts=row.attempts - 1, next_attempt_at=utcnow())


def _update_claim(conn: Connection, row: OutboxRow, **values: Any) -> bool:
    """Set `values` on `row` while it is still pending under this claim's attempt count."""
    return (
        conn.execute(
            update(outbox)
            .where(
                outbox.c.outbox_id == row.outbox_id,
                outbox.c.status == "pending",
                outbox.c.attempts == row.attempts,
            )
            .values(**values)
        ).rowcount
        == 1
    )


def mark_delivered(conn: Connection, outbox_id: int) -> bool:
    return (
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == outbox_id, outbox.c.status != "delivered")
            .values(status="delivered", delivered_at=utcnow(), last_error=None)
        ).rowcount
        == 1
    )


def mark_failed(
    conn: Connection,
    row: OutboxRow,
    error: str,
    *,
    retry_at: datetime,
    dead: bool,
    throttled: bool = False,
) -> bool:
    """Record a failed attempt of the claim `row` (compare-and-set on its attempt count: a
    later claim of the same row is not overwritten). A `throttled` one (the backend answered
    429) is counted in `throttled` too, in the same compare-and-set: `attempts` never goes back,
    so a claim taken over meanwhile still finds its token spent."""
    values: dict[str, Any] = {
        "status": "dead" if dead else "pending",
        "last_error": error[:1000],
        "next_attempt_at": retry_at,
    }
    if throttled:
        values["throttled"] = outbox.c.throttled + 1
    return (
        conn.execute(
            update(outbox)
            .where(
                outbox.c.outbox_id == row.outbox_id,
                outbox.c.status == "pending",
                outbox.c.attempts == row.attempts,
            )
            .values(**values)
        ).rowcount
        == 1
    )


def retry_dead(conn: Connection, outbox_id: int) -> bool:
    """An operator's retry: a dead row is due again now, with fresh attempt and throttled
    counts."""
    return (
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == outbox_id, outbox.c.status == "dead")
            .values(status="pending", attempts=0, throttled=0, next_attempt_at=utcnow())
        ).rowcount
        == 1
    )


def get_row(conn: Connection, outbox_id: int) -> OutboxRow | None:
    row = conn.execute(select(outbox).where(outbox.c.outbox_id == outbox_id)).one_or_none()
    return OutboxRow.from_row(row) if row is not None else None


def list_rows(
    conn: Connection,
    *,
    task_id: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    after_id: int | None = None,
    limit: int = 50,
) -> list[OutboxRow]:
    """Oldest first; `after_id` is the last outbox id already seen (the cursor)."""
    conditions = []
    if task_id is not None:
        conditions.append(outbox.c.task_id == task_id)
    if status is not None:
        conditions.append(outbox.c.status == status)
    if kind is not None:
        conditions.append(outbox.c.kind == kind)
    if after_id is not None:
        conditions.append(outbox.c.outbox_id > after_id)
    query = select(outbox).where(*conditions).order_by(outbox.c.outbox_id).limit(limit)
    return [OutboxRow.from_row(row) for row in conn.execute(query)]


def delivery_summary(conn: Connection, task_id: str) -> dict[str, Any]:
    """For `tasks show`: counts per kind and status, and the dead and undelivered rows."""
    counts: dict[str, dict[str, int]] = {}
    for kind, status, count in conn.execute(
        select(outbox.c.kind, outbox.c.status, func.count())
        .where(outbox.c.task_id == task_id)
        .group_by(outbox.c.kind, outbox.c.status)
    ):
        counts.setdefault(str(kind), {})[str(status)] = int(count)
    open_rows = conn.execute(
        select(outbox)
        .where(outbox.c.task_id == task_id, outbox.c.status != "delivered")
        .order_by(outbox.c.outbox_id)
        .limit(20)
    )
    return {"counts": counts, "undelivered": [OutboxRow.from_row(r).public() for r in open_rows]}
