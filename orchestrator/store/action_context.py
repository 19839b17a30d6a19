"""What an approver needs beside an action to decide on it: the title of the task it would act
for, and the node it serves as the plan it was proposed under drew it (title, status, why).

Read for a page of actions at once, with two queries: the task titles, and the plan revisions
the actions name. A revision is never rewritten, so what is read here stays true of the action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from orchestrator.store.actions import ActionRecord
from orchestrator.store.tables import plan_revisions, tasks

__all__ = ["ActionContext", "action_contexts"]


@dataclass(frozen=True)
class ActionContext:
    """The task's title, and the action's node as proposed (None: its revision or node is
    gone, or the action names no revision)."""

    task_title: str | None
    node: dict[str, Any] | None


def action_contexts(conn: Connection, records: Sequence[ActionRecord]) -> dict[str, ActionContext]:
    """Each action's context, by action id."""
    if not records:
        return {}
    task_ids = sorted({a.task_id for a in records})
    query = select(tasks.c.task_id, tasks.c.title).where(tasks.c.task_id.in_(task_ids))
    titles: dict[str, str] = {row.task_id: row.title for row in conn.execute(query)}
    named = sorted({(a.session_id, a.plan_revision) for a in records if a.plan_revision})
    nodes: dict[tuple[str, int], Any] = {}
    if named:
        revisions = select(
            plan_revisions.c.session_id, plan_revisions.c.revision, plan_revisions.c.nodes
        ).where(
            or_(
                *(
                    and_(plan_revisions.c.session_id == s, plan_revisions.c.revision == r)
                    for s, r in named
                )
            )
        )
        nodes = {(s, r): n for s, r, n in conn.execute(revisions)}
    return {
        a.action_id: ActionContext(
            titles.get(a.task_id),
            _node(nodes.get((a.session_id, a.plan_revision or 0)), a.node_id),
        )
        for a in records
    }


def _node(nodes: Any, node_id: str) -> dict[str, Any] | None:
    """The node's title, status, reason and description, each text or None (a stored node of
    another shape shows what it has)."""
    found = next((n for n in nodes or () if isinstance(n, dict) and n.get("id") == node_id), None)
    if found is None:
        return None
    return {key: _text(found.get(key)) for key in ("title", "status", "reason", "description")}


def _text(value: Any) -> str | None:
    """Text as stored; None for nothing written (a node without a description stores "")."""
    return value if isinstance(value, str) and value else None
