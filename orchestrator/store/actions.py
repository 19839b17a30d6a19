"""Actions: work orders and commands the agent proposes and only a human approves or rejects."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Row, Update, func, insert, select, update

from orchestrator.domain.approvals import action_digest
from orchestrator.domain.fences import Fence
from orchestrator.store.keyset import past
from orchestrator.store.tables import actions
from orchestrator.store.types import utcnow

__all__ = [
    "ActionRecord",
    "actions_of_task",
    "count_pending",
    "decide_action",
    "get_action",
    "insert_action",
    "list_actions",
    "same_proposal",
    "supersede_node_actions",
    "supersede_task_actions",
    "superseded_from_rows",
]


@dataclass(frozen=True)
class ActionRecord:
    action_id: str
    task_id: str
    generation: int
    session_id: str
    node_id: str
    kind: str
    payload: dict[str, Any]
    status: str
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    created_at: datetime
    plan_revision: int | None
    digest: str

    @classmethod
    def from_row(cls, row: Row[Any] | SimpleNamespace) -> ActionRecord:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def insert_action(
    conn: Connection,
    fence: Fence,
    session_id: str,
    node_id: str,
    kind: str,
    payload: dict[str, Any],
    *,
    plan_revision: int | None = None,
) -> ActionRecord:
    action_id = str(uuid.uuid4())
    conn.execute(
        insert(actions).values(
            action_id=action_id,
            task_id=fence.task_id,
            generation=fence.generation,
            session_id=session_id,
            node_id=node_id,
            kind=kind,
            payload=payload,
            status="pending_approval",
            created_at=utcnow(),
            plan_revision=plan_revision,
            digest=action_digest(kind, payload),
        )
    )
    record = get_action(conn, action_id)
    assert record is not None
    return record


def get_action(conn: Connection, action_id: str, *, lock: bool = False) -> ActionRecord | None:
    query = select(actions).where(actions.c.action_id == action_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).one_or_none()
    return ActionRecord.from_row(row) if row is not None else None


def decide_action(
    conn: Connection,
    action_id: str,
    status: str,
    decided_by: str,
    note: str | None,
    *,
    digest: str | None = None,
) -> bool:
    """pending_approval → `status` (compare-and-set, on the digest too when given); False when
    the action was decided or superseded first."""
    where = [actions.c.action_id == action_id, actions.c.status == "pending_approval"]
    if digest is not None:
        where.append(actions.c.digest == digest)
    return (
        conn.execute(
            update(actions)
            .where(*where)
            .values(status=status, decided_by=decided_by, decided_at=utcnow(), note=note)
        ).rowcount
        == 1
    )


def list_actions(
    conn: Connection,
    *,
    status: str | None,
    task_id: str | None,
    limit: int,
    after: tuple[datetime, str] | None = None,
    oldest_first: bool = False,
    decided: bool = False,
) -> list[ActionRecord]:
    """Newest first, or oldest first (the longest waiting, what an approver decides first);
    `after` is the (created_at, action_id) of the last row already seen in that order;
    `decided`: every status but `pending_approval` (a task's decided history)."""
    query = select(actions)
    if status is not None:
        query = query.where(actions.c.status == status)
    if decided:
        query = query.where(actions.c.status != "pending_approval")
    if task_id is not None:
        query = query.where(actions.c.task_id == task_id)
    if after is not None:
        query = query.where(
            past(actions.c.created_at, actions.c.action_id, after, newest_first=not oldest_first)
        )
    if oldest_first:
        query = query.order_by(actions.c.created_at, actions.c.action_id)
    else:
        query = query.order_by(actions.c.created_at.desc(), actions.c.action_id.desc())
    return [ActionRecord.from_row(row) for row in conn.execute(query.limit(limit))]


def count_pending(conn: Connection, *, task_id: str | None = None) -> int:
    """How many actions wait for a decision (of one task): read from the (status, created_at)
    index alone, so it costs what is pending, never the decided history."""
    query = select(func.count()).select_from(actions)
    query = query.where(actions.c.status == "pending_approval")
    if task_id is not None:
        query = query.where(actions.c.task_id == task_id)
    return int(conn.execute(query).scalar_one())


def same_proposal(conn: Connection, task_id: str, node_id: str, digest: str) -> ActionRecord | None:
    """The task's latest action for `node_id` with `digest` that was not superseded: a
    re-proposal of it (any generation of the task) returns it instead of a new one."""
    row = conn.execute(
        select(actions)
        .where(
            actions.c.task_id == task_id,
            actions.c.node_id == node_id,
            actions.c.digest == digest,
            actions.c.status != "superseded",
        )
        .order_by(actions.c.created_at.desc(), actions.c.action_id)
        .limit(1)
    ).one_or_none()
    return ActionRecord.from_row(row) if row is not None else None


def supersede_node_actions(
    conn: Connection, task_id: str, node_id: str, by_action: str
) -> list[ActionRecord]:
    """Pending actions of the node are superseded by a new proposal with another digest: the
    actions as superseded (for their `action_superseded` notices)."""
    return _superseded(
        conn,
        update(actions)
        .where(
            actions.c.task_id == task_id,
            actions.c.node_id == node_id,
            actions.c.status == "pending_approval",
            actions.c.action_id != by_action,
        )
        .values(status="superseded", note=f"superseded by action {by_action}"),
    )


def supersede_task_actions(conn: Connection, task_id: str, note: str) -> list[ActionRecord]:
    """Every pending action of the task is superseded (a requeue, a cancel, a finished task):
    the actions as superseded, in one statement."""
    return _superseded(
        conn,
        update(actions)
        .where(actions.c.task_id == task_id, actions.c.status == "pending_approval")
        .values(status="superseded", note=note),
    )


def superseded_from_rows(rows: Iterable[Row[Any] | SimpleNamespace]) -> list[ActionRecord]:
    """Actions a statement superseded (its `RETURNING` rows), oldest first."""
    found = [ActionRecord.from_row(row) for row in rows]
    return sorted(found, key=lambda action: (action.created_at, action.action_id))


def _superseded(conn: Connection, statement: Update) -> list[ActionRecord]:
    return superseded_from_rows(conn.execute(statement.returning(*actions.c)))


def actions_of_task(conn: Connection, task_id: str) -> list[ActionRecord]:
    """Every action of the task, oldest first (what the next generation reads)."""
    rows = conn.execute(
        select(actions)
        .where(actions.c.task_id == task_id)
        .order_by(actions.c.created_at, actions.c.action_id)
    )
    return [ActionRecord.from_row(row) for row in rows]
