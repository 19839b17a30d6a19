"""Action proposals (from an execution) and human decisions (from operators)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.domain.cursors import decode_cursor
from orchestrator.domain.vocabulary import ACTION_KINDS, ACTION_STATUSES
from orchestrator.errors import ConflictError, InvalidTransition, NotFound, ValidationFailed
from orchestrator.services.plans import PlanService, publish_txn
from orchestrator.store import actions as action_store
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store.actions import ActionRecord
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.tools.base import Fence

__all__ = ["ActionService", "Proposal"]


@dataclass(frozen=True)
class Proposal:
    action: ActionRecord
    plan_revision: int
    created: bool


class ActionService:
    def __init__(self, db: Database, plans: PlanService) -> None:
        self.db = db
        self.plans = plans

    def propose(
        self, fence: Fence, session_id: str, node_id: str, kind: str, payload: dict[str, Any]
    ) -> Proposal:
        """A pending_approval action for a node of the saved plan, its id written back to the node.

        The action, and the plan revision that names it, commit together or not at all.
        Refused with `report_already_saved` once the generation saved its report (it comes last).
        """
        if kind not in ACTION_KINDS:
            raise ValidationFailed(
                f"kind must be one of {', '.join(ACTION_KINDS)}", code="invalid_kind"
            )
        with self.db.transaction() as conn:
            check_fence(conn, fence)
            report_store.refuse_after_report(conn, fence, "an action proposal")
            plan = plan_store.latest_revision(conn, session_id)
            node = next((n for n in plan.nodes if n["id"] == node_id), None) if plan else None
            if plan is None or node is None:
                raise ConflictError(
                    f"node {node_id!r} is not in the saved plan; publish the plan with that "
                    "action node first",
                    code="node_not_in_plan",
                )
            if node.get("action_id"):
                existing = action_store.get_action(conn, node["action_id"])
                if existing is not None and existing.status != "superseded":
                    return Proposal(existing, plan.revision, created=False)
            action = action_store.insert_action(conn, fence, session_id, node_id, kind, payload)
            nodes = [
                dict(n, action_id=action.action_id) if n["id"] == node_id else n for n in plan.nodes
            ]
            published = publish_txn(
                conn,
                session_id,
                {
                    "request_id": f"action:{action.action_id}",
                    "title": plan.title,
                    "reason": f"{kind} {action.action_id} proposed for node {node_id}",
                    "nodes": nodes,
                    "edges": plan.edges,
                },
                fence=fence,
            )
        self.plans.notify(published.plan)
        return Proposal(action, published.plan.revision, created=True)

    def decide(self, action_id: str, *, approve: bool, by: str, note: str | None) -> ActionRecord:
        """A human's approval or rejection; only a pending action can be decided."""
        status = "approved" if approve else "rejected"
        with self.db.transaction() as conn:
            action = action_store.get_action(conn, action_id, lock=True)
            if action is None:
                raise NotFound(f"action {action_id} does not exist")
            if not action_store.decide_action(conn, action_id, status, by, note):
                raise InvalidTransition(f"action {action_id} is already {action.status}")
            decided = action_store.get_action(conn, action_id)
        assert decided is not None
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.APPROVALS_DECIDED.labels(status).inc()
        return decided

    def list(
        self,
        *,
        status: str | None = "pending_approval",
        task_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> list[ActionRecord]:
        if status is not None and status not in ACTION_STATUSES:
            raise ValidationFailed(f"unknown status {status!r}", code="invalid_status")
        after = decode_cursor(cursor) if cursor else None
        with self.db.transaction(readonly=True) as conn:
            return action_store.list_actions(
                conn, status=status, task_id=task_id, limit=limit, after=after
            )
