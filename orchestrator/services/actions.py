"""Action proposals (from an execution) and human decisions (from operators).

A decision is bound to what the person saw (DESIGN invariant 24): the action's digest, named by
the approver, and its plan node, which must still serve it. It is decided once (compare-and-set)
and moves the task in the same transaction (`redecide_txn`). `_decide_txn` is the one place a
row that must commit with the decision (the outbox's) is written: see `DecisionHook`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from orchestrator.domain.approvals import action_digest, still_bound
from orchestrator.domain.cursors import decode_cursor
from orchestrator.domain.fences import Fence
from orchestrator.domain.fingerprints import NonCanonical
from orchestrator.domain.plans import distinct_edges
from orchestrator.domain.vocabulary import ACTION_KINDS, ACTION_STATUSES, OPEN_NODE_STATUSES
from orchestrator.errors import ConflictError, InvalidTransition, NotFound, ValidationFailed, echoed
from orchestrator.services.dispatch import Dispatcher, RecordingDispatcher, WakeUp, wake
from orchestrator.services.plans import PlanService, publish_txn
from orchestrator.services.redecide import redecide_txn
from orchestrator.store import action_notices as notice_store
from orchestrator.store import actions as action_store
from orchestrator.store import outbox_views
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store import tasks as task_store
from orchestrator.store.action_context import ActionContext, action_contexts
from orchestrator.store.actions import ActionRecord
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence

__all__ = ["ActionService", "Decided", "DecisionHook", "Proposal"]

#: Runs inside the decision's transaction, after the compare-and-set: what it writes commits
#: with the decision or not at all (the outbox row of an approved action goes here).
DecisionHook = Callable[[Connection, ActionRecord], None]


@dataclass(frozen=True)
class Proposal:
    action: ActionRecord
    plan_revision: int
    created: bool


@dataclass(frozen=True)
class Decided:
    """A decision, and the wake-up of the generation it queued (None when it queued none, as
    while another action of the task still waits)."""

    action: ActionRecord
    wake_up: WakeUp | None


class ActionService:
    def __init__(
        self,
        db: Database,
        plans: PlanService,
        dispatcher: Dispatcher | None = None,
        decision_hooks: Sequence[DecisionHook] = (),
    ) -> None:
        self.db = db
        self.plans = plans
        # Without one (an execution's tool), a decision's wake-up is only recorded; the
        # sweeper republishes a queued generation whose wake-up was not sent.
        self.dispatcher: Dispatcher = dispatcher or RecordingDispatcher()
        self.decision_hooks = list(decision_hooks)

    def propose(
        self, fence: Fence, session_id: str, node_id: str, kind: str, payload: dict[str, Any]
    ) -> Proposal:
        """A pending_approval action for a node of the saved plan, its id written back to the node.

        The action, and the plan revision that names it, commit together or not at all. A
        re-proposal with the same digest for the same node (in any generation of the task)
        returns the existing action; another digest supersedes the node's pending one.
        Refused with `node_closed` for a node already completed, failed, skipped or cancelled
        (unless it carries that same action): its approval would back nothing.
        Refused with `report_already_saved` once the generation saved its report (it comes last).
        """
        if kind not in ACTION_KINDS:
            raise ValidationFailed(
                f"kind must be one of {', '.join(ACTION_KINDS)}", code="invalid_kind"
            )
        try:
            digest = action_digest(kind, payload)
        except NonCanonical as exc:
            raise ValidationFailed(f"payload has no canonical JSON form: {exc}") from None
        with self.db.transaction() as conn:
            check_fence(conn, fence)
            report_store.refuse_after_report(conn, fence, "an action proposal")
            plan = plan_store.latest_revision(conn, session_id)
            # A stored node of an older shape (not an object) is never the one proposed for;
            # the republish below refuses the plan with what is wrong with it.
            node = next((n for n in plan.nodes if _node_id(n) == node_id), None) if plan else None
            if plan is None or node is None:
                raise ConflictError(
                    f"node {node_id!r} is not in the saved plan; publish the plan with that "
                    "action node first",
                    code="node_not_in_plan",
                )
            action = action_store.same_proposal(conn, fence.task_id, node_id, digest)
            status = node.get("status")
            if status not in OPEN_NODE_STATUSES and (
                action is None or node.get("action_id") != action.action_id
            ):
                # A node closed before its action was proposed (completed on a reading, say)
                # would stand done whatever a person decides: the approval comes first.
                raise ConflictError(
                    f"node {node_id!r} is {status}: an action is proposed for an open node "
                    "(pending, running or waiting) and the node completed after its approval; "
                    "for new work add a new node",
                    code="node_closed",
                )
            created = action is None
            if action is None:
                action = action_store.insert_action(
                    conn, fence, session_id, node_id, kind, payload, plan_revision=plan.revision
                )
                replaced = action_store.supersede_node_actions(
                    conn, fence.task_id, node_id, action.action_id
                )
                notice_store.record_superseded(conn, replaced)  # before the new one's event
            if node.get("action_id") == action.action_id:
                return Proposal(action, plan.revision, created=False)
            nodes = [
                dict(n, action_id=action.action_id) if _node_id(n) == node_id else n
                for n in plan.nodes
            ]
            published = publish_txn(
                conn,
                session_id,
                {
                    "request_id": f"action:{action.action_id}",
                    "title": plan.title,
                    "reason": f"{kind} {action.action_id} proposed for node {node_id}",
                    "nodes": nodes,
                    "edges": distinct_edges(plan.edges),
                },
                fence=fence,
            )
            if created:
                notice_store.record_proposal(conn, action)
        if published.created:
            self.plans.notify(published.plan)
        return Proposal(action, published.plan.revision, created=created)

    def decide(
        self,
        action_id: str,
        *,
        approve: bool,
        by: str,
        note: str | None,
        digest: str | None = None,
    ) -> ActionRecord:
        """A human's approval or rejection, decided once; the task moves at once (see
        `decide_and_wake`)."""
        return self.decide_and_wake(
            action_id, approve=approve, by=by, note=note, digest=digest
        ).action

    def decide_and_wake(
        self,
        action_id: str,
        *,
        approve: bool,
        by: str,
        note: str | None,
        digest: str | None = None,
    ) -> Decided:
        """A human's approval or rejection, decided once; the task moves at once, and the
        answer says what became of the wake-up of a generation it queued.

        An approval names the digest it approves: another digest, or an action that was
        superseded or no longer served by its plan node, is refused with 409 `stale_approval`.
        A rejection may name it too; it is refused only for a superseded action or another
        digest. An action already decided: 409 `already_decided`.
        """
        if approve and not digest:
            raise ValidationFailed(
                "an approval names the digest of the action it approves (see `actions show`)",
                code="digest_required",
            )
        with self.db.transaction() as conn:
            decided, next_generation = self._decide_txn(conn, action_id, approve, by, note, digest)
        wake_up = None
        if next_generation is not None:
            wake_up = wake(self.db, self.dispatcher, decided.task_id, next_generation)
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.APPROVALS_DECIDED.labels(decided.status).inc()
        return Decided(decided, wake_up)

    def _decide_txn(
        self,
        conn: Connection,
        action_id: str,
        approve: bool,
        by: str,
        note: str | None,
        digest: str | None,
    ) -> tuple[ActionRecord, int | None]:
        action = action_store.get_action(conn, action_id)
        if action is None:
            raise NotFound(f"action {echoed(action_id)} does not exist")
        # The task row first, as every fenced write of an execution takes it: a proposal or a
        # plan publish of the task cannot interleave with the decision.
        task = task_store.get_task(conn, action.task_id, lock=True)
        assert task is not None  # an action goes with its task
        action = action_store.get_action(conn, action_id)
        assert action is not None
        if action.status in ("approved", "rejected"):
            raise InvalidTransition(
                f"action {action_id} is already {action.status} by {action.decided_by}",
                code="already_decided",
            )
        if action.status == "superseded":
            raise _stale(f"action {action_id} was superseded: {action.note or 'no reason'}")
        if digest is not None and digest != action.digest:
            raise _stale(
                f"action {action_id} has digest {action.digest}, not {digest}: "
                "look at it again (`actions show`) before deciding"
            )
        # Only an approval carries the action forward, so only it must still be served by its
        # node: a rejection of one whose node was cancelled, skipped, failed or completed since
        # is what lets the task, which waits on every pending action, move on. (A pending
        # action's session is the task's current one: a requeue supersedes pending actions,
        # and a step closed while one waits queues no generation.)
        plan = plan_store.latest_revision(conn, action.session_id) if approve else None
        if approve and not still_bound(action_id, action.node_id, plan.nodes if plan else None):
            raise _stale(
                f"node {action.node_id} of the plan no longer serves action {action_id} "
                f"({_why_unbound(action.node_id, plan.nodes if plan else None)}); reject it "
                "to let the task move on"
            )
        status = "approved" if approve else "rejected"
        if not action_store.decide_action(conn, action_id, status, by, note, digest=action.digest):
            raise InvalidTransition(f"action {action_id} was decided meanwhile")
        decided = action_store.get_action(conn, action_id)
        assert decided is not None
        notice_store.record_decision(conn, decided)  # its webhook, and the delivery
        for hook in self.decision_hooks:  # rows that must commit with the decision
            hook(conn, decided)
        return decided, redecide_txn(conn, task)

    def get(self, action_id: str) -> ActionRecord:
        with self.db.transaction(readonly=True) as conn:
            action = action_store.get_action(conn, action_id)
        if action is None:
            raise NotFound(f"action {echoed(action_id)} does not exist")
        return action

    def shown(self, action_id: str) -> tuple[ActionRecord, dict[str, Any] | None]:
        """The action and where its delivery to the business backend stands (its outbox row,
        without the body; None until it is approved), read together."""
        with self.db.transaction(readonly=True) as conn:
            action = action_store.get_action(conn, action_id)
            delivery = outbox_views.action_delivery(conn, action_id)
        if action is None:
            raise NotFound(f"action {echoed(action_id)} does not exist")
        return action, delivery.public() if delivery is not None else None

    def list(
        self,
        *,
        status: str | None = "pending_approval",
        task_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> list[ActionRecord]:
        listed = self._list(status, task_id, limit, cursor, oldest_first, deliveries=False)
        return [action for action, _ in listed]

    def listed(
        self,
        *,
        status: str | None = "pending_approval",
        task_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        oldest_first: bool = False,
        decided: bool = False,
    ) -> builtins.list[tuple[ActionRecord, dict[str, Any] | None]]:
        """`list`, each action with its delivery (`shown`'s, None until approved), read in the
        same transaction with one query for the page: an operator looking for approved work
        orders the backend never took sees them in the list, without opening each one.
        `decided` (with `status` None): every status but `pending_approval`."""
        return self._list(
            status, task_id, limit, cursor, oldest_first, deliveries=True, decided=decided
        )

    def _list(
        self,
        status: str | None,
        task_id: str | None,
        limit: int,
        cursor: str | None,
        oldest_first: bool,
        *,
        deliveries: bool,
        decided: bool = False,
    ) -> builtins.list[tuple[ActionRecord, dict[str, Any] | None]]:
        if status is not None and status not in ACTION_STATUSES:
            raise ValidationFailed(f"unknown status {status!r}", code="invalid_status")
        after = decode_cursor(cursor, oldest_first=oldest_first) if cursor else None
        with self.db.transaction(readonly=True) as conn:
            actions = action_store.list_actions(
                conn,
                status=status,
                task_id=task_id,
                limit=limit,
                after=after,
                oldest_first=oldest_first,
                decided=decided,
            )
            if not actions and task_id is not None and task_store.get_task(conn, task_id) is None:
                # Not "no actions" for a mistyped (or cut short) task id, in the API as in the CLI.
                raise NotFound(f"task {echoed(task_id)} does not exist")
            rows = (
                outbox_views.action_deliveries(conn, [a.action_id for a in actions])
                if deliveries
                else {}
            )
        return [(a, rows[a.action_id].public() if a.action_id in rows else None) for a in actions]

    def contexts(self, records: Sequence[ActionRecord]) -> dict[str, ActionContext]:
        """What an approver reads beside each action: its task's title and its node as the
        plan it was proposed under drew it."""
        with self.db.transaction(readonly=True) as conn:
            return action_contexts(conn, records)

    def count_pending(self, task_id: str | None = None) -> int:
        """How many actions wait for a decision (of one task: a task that does not exist is
        `NotFound`, as in the list, not "none waits")."""
        with self.db.transaction(readonly=True) as conn:
            pending = action_store.count_pending(conn, task_id=task_id)
            if not pending and task_id is not None and task_store.get_task(conn, task_id) is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            return pending


def _why_unbound(node_id: str, nodes: Sequence[Any] | None) -> str:
    """Why the node no longer serves the action, in words for the approver."""
    node = next((n for n in nodes or () if _node_id(n) == node_id), None)
    if node is None:
        return "the node is not in the plan"
    status = node.get("status")
    if status == "completed":
        # Only a person completes a node while its action waits; the reason says who and when.
        return f"the node was completed without it: {node.get('reason') or 'no reason given'}"
    if status in ("cancelled", "skipped", "failed"):
        return f"the node is {status}"
    return "the node was given another action"


def _stale(message: str) -> ConflictError:
    return ConflictError(message, code="stale_approval")


def _node_id(node: Any) -> Any:
    return node.get("id") if isinstance(node, dict) else None
