"""A task's plan whichever session holds it (DESIGN invariant 22): the continuity check of a new
generation's first publish, and `GET /api/v1/tasks/{task_id}/plan`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import (
    ARRAY,
    CompoundSelect,
    Connection,
    String,
    any_,
    bindparam,
    literal_column,
    null,
    select,
    union_all,
)

from orchestrator.store import driver
from orchestrator.store.plans import PlanRecord
from orchestrator.store.tables import actions, evidence, invocation_receipts, plan_revisions

__all__ = ["action_statuses", "cited_records", "task_actions", "task_latest_plan"]


def task_latest_plan(
    conn: Connection, task_id: str, before_generation: int | None = None
) -> PlanRecord | None:
    """The task's latest revision (of its latest generation that published one), optionally
    only among generations before `before_generation`.

    Only executions' revisions count: a chat about the task (a collaboration session) may hold
    a plan too, of no generation. A generation has one session, whose revision numbers are its
    order; `updated_at` is not (a person's revision and the agent's come from two clocks).
    """
    query = select(plan_revisions).where(
        plan_revisions.c.task_id == task_id, plan_revisions.c.generation.is_not(None)
    )
    if before_generation is not None:
        query = query.where(plan_revisions.c.generation < before_generation)
    newest_first = (plan_revisions.c.generation.desc(), plan_revisions.c.revision.desc())
    row = conn.execute(query.order_by(*newest_first).limit(1)).one_or_none()
    return PlanRecord.from_row(row) if row is not None else None


def action_statuses(
    conn: Connection, task_id: str | None, action_ids: Iterable[str]
) -> dict[str, str]:
    """The stored status of each of `action_ids` that is an action of `task_id` (any of its
    generations); none for a plan of no task. Another task's action is not looked at: its
    approval says nothing about this task's nodes."""
    return {
        action_id: status
        for action_id, (status, _) in task_actions(conn, task_id, action_ids).items()
    }


def task_actions(
    conn: Connection, task_id: str | None, action_ids: Iterable[str]
) -> dict[str, tuple[str, str]]:
    """`(status, node_id)` of each of `action_ids` that is an action of `task_id`: what it
    stands at, and the plan node it was proposed for (the only node its approval serves)."""
    wanted = sorted(set(action_ids))
    if not wanted or task_id is None:
        return {}
    rows = conn.execute(
        select(actions.c.action_id, actions.c.status, actions.c.node_id).where(
            actions.c.task_id == task_id, actions.c.action_id.in_(wanted)
        )
    )
    return {row.action_id: (row.status, row.node_id) for row in rows}


def _cited(among: Callable[[Any], Any]) -> CompoundSelect[Any]:
    return union_all(
        select(
            literal_column("'evidence'").label("kind"),
            evidence.c.evidence_id.label("record_id"),
            null().label("status"),
        ).where(evidence.c.task_id == bindparam("task_id"), among(evidence.c.evidence_id)),
        select(
            literal_column("'receipt'"),
            invocation_receipts.c.invocation_id,
            invocation_receipts.c.status,
        ).where(
            invocation_receipts.c.owner == bindparam("owner"),
            among(invocation_receipts.c.invocation_id),
        ),
    )


# Built once (a statement built per call costs more to construct and key than to send); the
# ids are one parameter: an array on Postgres (sent by store.driver), an expanding list else.
_CITED = _cited(lambda column: column.in_(bindparam("ids", expanding=True)))
_CITED_ANY = _cited(lambda column: column == any_(bindparam("ids", type_=ARRAY(String))))


def cited_records(
    conn: Connection, task_id: str, ids: Iterable[str]
) -> tuple[set[str], dict[str, str]]:
    """Among `ids`: the task's evidence ids, and the task's write receipts with their status."""
    wanted = sorted(set(ids))
    if not wanted:
        return set(), {}
    # Both lookups in one statement (one round trip): evidence rows carry no status.
    statement = _CITED_ANY if conn.dialect.name == "postgresql" else _CITED
    rows = driver.fetch(
        conn, statement, {"task_id": task_id, "owner": f"task:{task_id}", "ids": wanted}
    )
    found = {record_id for kind, record_id, _ in rows if kind == "evidence"}
    return found, {record_id: status for kind, record_id, status in rows if kind == "receipt"}
