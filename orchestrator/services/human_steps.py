"""A person completes, fails or skips a human node of a task's current plan (DESIGN §8).

The change is a new plan revision written server-side, in the session of the task's latest plan:
the current generation's, or, until that generation publishes, the earlier generation's plan the
console shows (its first publish keeps the person's node: invariant 22). It takes the task row's
lock first, then the session's, as every fenced write of an execution does, so the person's
revision and the agent's are serialised and neither is lost (an agent publish that still shows
the node open keeps the person's node: `keep_person_closed`).
The task is re-decided in the same transaction: a `waiting` task with nothing else to wait for
queues its next generation, and so does one whose human node a person failed while no action is
pending (the agent retries the step with a new node, or reports the task failed).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from orchestrator.domain import plans as rules
from orchestrator.domain.human_steps import PERSON_REQUEST_PREFIX, close_human_node
from orchestrator.domain.retries import next_retries
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.errors import ConflictError, NotFound, echoed
from orchestrator.services.dispatch import Dispatcher, WakeUp, wake
from orchestrator.services.plans import PlanService
from orchestrator.services.redecide import redecide_txn
from orchestrator.store import plans as plan_store
from orchestrator.store import sessions as session_store
from orchestrator.store import task_events as event_store
from orchestrator.store import task_plans
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.plans import PlanRecord
from orchestrator.store.records import TaskRecord
from orchestrator.store.types import utcnow

__all__ = ["HumanStep", "HumanStepService"]


@dataclass(frozen=True)
class HumanStep:
    """What a person's step wrote: the revision, and where the task stands after it."""

    task_id: str
    node_id: str
    status: str
    by: str
    at: datetime
    plan: PlanRecord
    task_status: str
    generation: int
    #: The wake-up of the generation the step queued; None when it queued none.
    wake_up: WakeUp | None = None


def _plan_to_close_in(conn: Connection, task: TaskRecord) -> PlanRecord:
    """The plan a person's step applies to, its session locked: the task's latest plan, which
    the console and `GET /api/v1/tasks/{id}/plan` show.

    That is the current generation's latest revision, or, until that generation publishes, the
    latest revision of the last generation that did (a failed step or a lost lease queued the
    next one). The person's revision then goes into that earlier session, where the next
    generation's first publish finds it and keeps it (invariant 22, `keep_person_closed`);
    refusing the step until the agent publishes kept an operator waiting for minutes, or for
    ever if that generation never publishes. The caller holds the task row's lock, as every
    plan write of the task does, so the revision read here stays the latest until the commit.
    """
    if task.session_id is not None:
        session_store.get_session(conn, task.session_id, lock=True)
        current = plan_store.latest_revision(conn, task.session_id)
        if current is not None:
            return current
    earlier = task_plans.task_latest_plan(conn, task.task_id)
    if earlier is None:
        raise ConflictError(
            f"task {task.task_id} has no plan yet (generation {task.generation} has not "
            "published one); try again once it has",
            code="no_plan",
        )
    # Task row first, then the session: the lock order of every fenced write.
    session_store.get_session(conn, earlier.session_id, lock=True)
    return earlier


class HumanStepService:
    def __init__(self, db: Database, plans: PlanService, dispatcher: Dispatcher) -> None:
        self.db = db
        self.plans = plans
        self.dispatcher = dispatcher

    def close(
        self,
        task_id: str,
        node_id: str,
        status: str,
        *,
        by: str,
        evidence: str | None = None,
        reason: str | None = None,
    ) -> HumanStep:
        """Close a human node of the task's latest plan as `status` (completed, failed, skipped).

        Refused: 404 `not_found` (task), 404 `unknown_node`, 409 `agent_node`, `node_closed`,
        `task_finished`, `no_plan` (no generation of the task has published a plan); then
        nothing was written.
        """
        at = utcnow()
        with self.db.transaction() as conn:
            task = task_store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            if task.status in TERMINAL_TASK_STATUSES:
                raise ConflictError(f"task {task_id} is {task.status}", code="task_finished")
            plan = _plan_to_close_in(conn, task)
            session_id = plan.session_id
            readable = rules.readable_nodes(plan.nodes) or []
            nodes = close_human_node(
                readable, node_id, status, by=by, at=at, evidence=evidence, reason=reason
            )
            payload = {
                "request_id": f"{PERSON_REQUEST_PREFIX}{uuid.uuid4()}",
                "title": plan.title,
                "reason": f"human node {node_id} {status} by {by}",
                "nodes": nodes,
                "edges": rules.distinct_edges(rules.readable_edges(plan.edges) or []),
            }
            draft = rules.validate_plan(payload, readable)
            record = PlanRecord(
                session_id=session_id,
                revision=plan.revision + 1,
                request_id=draft.request_id,
                schema_version=rules.SCHEMA_VERSION,
                title=draft.title,
                reason=draft.reason,
                nodes=draft.nodes,
                edges=draft.edges,
                content_digest=draft.digest,
                task_id=task_id,
                generation=plan.generation,
                updated_at=at,
                # A person's step adds no node, so it draws no retry: a node that followed the
                # failed one retries nothing (`domain.retries`); the relation goes on as it was.
                retries=next_retries(
                    draft.nodes,
                    draft.edges,
                    previous_nodes=readable,
                    previous_edges=rules.readable_edges(plan.edges),
                    previous_retries=plan.retries,
                ),
            )
            plan_store.insert_revision(conn, record)
            if record.generation:
                # The task stream sees a person's revision like the agent's, in the same commit.
                # The event carries the plan's generation, which is the task's or, before the
                # task's generation publishes, an earlier one: it names the revision it logs (the
                # task's own generation is on its `queued` event and in the snapshot).
                event_store.record_event(
                    conn,
                    task_id,
                    "plan_revision",
                    generation=record.generation,
                    reason=record.reason,
                    data={"session_id": session_id, "revision": record.revision},
                    task_locked=True,  # read with its row locked above
                )
            failed = node_id if status == "failed" else None
            next_generation = redecide_txn(conn, task, failed_node=failed)
        self.plans.notify(record)
        wake_up = None
        if next_generation is not None:
            wake_up = wake(self.db, self.dispatcher, task_id, next_generation)
        return HumanStep(
            task_id=task_id,
            node_id=node_id,
            status=status,
            by=by,
            at=at,
            plan=record,
            task_status="queued" if next_generation is not None else task.status,
            generation=next_generation or task.generation,
            wake_up=wake_up,
        )
