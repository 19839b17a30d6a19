"""Action notices: what the business backend hears of an action, and an approval's delivery.

Each change of an action is a task event (`action_proposed`, `action_decided`,
`action_superseded`, `action_task_cancelled`, DESIGN invariant 24) written in the transaction
of the change; an approval also writes the action's own delivery row (one per approval,
unique on the action id), so an approval without its delivery (or the reverse) never commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, insert, select

from orchestrator.domain.times import wire_time
from orchestrator.store.actions import ActionRecord
from orchestrator.store.tables import actions, outbox
from orchestrator.store.task_events import (
    NewEvent,
    TaskEvent,
    event_json,
    record_event,
    record_events,
)
from orchestrator.store.types import utcnow

__all__ = [
    "record_cancelled_approvals",
    "record_decision",
    "record_proposal",
    "record_superseded",
]


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
            "approved_at": wire_time(action.decided_at or now),
        }
        conn.execute(
            insert(outbox).values(
                kind="action",
                task_id=action.task_id,
                action_id=action.action_id,
                body=event_json(body),
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
