"""publish_execution_plan and the plan readers (seed 004, DESIGN invariants 1-6).

One publish is one transaction: fence check, session row lock, request_id look-up, rules against
the previous revision, insert of revision n+1 (a fenced publish locks the session and looks up in
one statement) with which of its nodes retry which failed node (`domain.retries`), worked out
from the same previous revision. Only after the commit is the event sent (once, and only for a
new revision) and the caller's `after_commit` hook run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from sqlalchemy import Connection

from orchestrator.domain import plans as rules
from orchestrator.domain.fences import Fence
from orchestrator.domain.human_steps import keep_person_closed, reserved_request_id_problems
from orchestrator.domain.plan_authority import (
    Writer,
    authority_problems,
    citation_problems,
    cited_ids,
)
from orchestrator.domain.retries import next_retries
from orchestrator.errors import ConflictError, NotFound, echoed
from orchestrator.events import NullNotifier, PlanNotifier
from orchestrator.store import plans as store
from orchestrator.store import reports as report_store
from orchestrator.store import sessions as session_store
from orchestrator.store import task_events as event_store
from orchestrator.store import task_plans
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.store.plans import PlanRecord
from orchestrator.store.types import utcnow

__all__ = ["AfterCommit", "PlanService", "PublishResult", "SessionPlans", "publish_txn"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishResult:
    """The stored revision; `created` is False when an identical request_id was replayed."""

    plan: PlanRecord
    created: bool

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict()


#: Run after the publish committed (new revision or replay); executions renew their lease here.
AfterCommit = Callable[[PublishResult], None]


@dataclass(frozen=True)
class SessionPlans:
    """What a stream's first `state` event needs: is the session's execution running, the plan;
    and whether the session is finished (read before the plan: nothing is written after it)."""

    session_id: str
    running: bool
    latest: PlanRecord | None
    finished: bool = False

    @property
    def newest(self) -> int:
        """The newest revision's number, 0 when there is none."""
        return self.latest.revision if self.latest else 0


def publish_txn(
    conn: Connection,
    session_id: str,
    payload: Any,
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
    writer: Writer = "agent",
) -> PublishResult:
    """The publish inside the caller's transaction; the caller notifies after its commit.

    `writer="person"` is the server-side revision of a person closing a human node: the agent
    rules (`human_node`, `action_not_approved`) do not apply to it; all the others do.
    """
    draft, problems = rules.parse_plan(payload)
    raw_request_id = payload.get("request_id") if isinstance(payload, dict) else None
    # Looked up only when it is a request id at all: one its check refused (a NUL, a lone
    # surrogate) is reported with the other problems, and no store could be asked about it.
    request_id = raw_request_id if _is_id(raw_request_id, rules.MAX_REQUEST_ID) else None
    # Every publisher of a session queues on its row, so max(revision) + 1 stays gapless.
    context: store.PublishContext | None = None
    if fence is None:
        session = session_store.get_session(conn, session_id, lock=True)
    else:
        check_fence(conn, fence)
        locked = store.lock_for_fenced_publish(conn, session_id, fence, request_id)
        # Invariant 10: the report comes last; a generation that saved it publishes no more.
        if locked is None:
            report_store.refuse_after_report(conn, fence, "a plan publish")
            session = None
        elif locked.report_saved:
            raise report_store.report_already_saved(fence, "a plan publish")
        else:
            session, context = locked.session, locked.context
    if session is None:
        problems.insert(
            0,
            {"code": "unknown_session", "message": f"session {session_id} does not exist"},
        )
        rules.raise_problems(problems)
        raise AssertionError("unreachable")  # pragma: no cover
    _check_writer(session, fence)
    if context is None:
        context = store.publish_context(conn, session_id, request_id)
    if context.same_request is not None:
        revision, digest = context.same_request
        if draft is not None and draft.digest == digest:
            stored = store.get_revision(conn, session_id, revision)
            assert stored is not None  # read under the session lock a moment ago
            return PublishResult(stored, created=False)
        message = (
            f"request_id {request_id} was already used for revision {revision} "
            "with other content; use a new request_id for a new revision"
        )
        raise ConflictError(
            message,
            code="request_id_conflict",
            details=[{"code": "request_id_conflict", "message": message}],
        )
    nodes = draft.nodes if draft is not None else _raw_nodes(payload)
    previous = rules.readable_nodes(context.latest_nodes)
    previous_edges = rules.readable_edges(context.latest_edges)
    previous_retries = context.latest_retries
    if context.latest_revision == 0 and fence is not None and fence.generation > 1:
        # Invariant 22: the first plan of a new generation keeps the task's last plan.
        # (Generations start at 1, a CHECK on tasks and executions: the first has no
        # earlier plan to keep, so it does not look for one.) Its retries go on too.
        before = task_plans.task_latest_plan(conn, fence.task_id, fence.generation)
        previous = rules.readable_nodes(before.nodes) if before is not None else None
        previous_edges = rules.readable_edges(before.edges) if before is not None else None
        previous_retries = before.retries if before is not None else None
    # The nodes as the writer drew them: a failure it did not see is none of its edges' sources.
    drawn = nodes
    if draft is not None and fence is not None:
        # A person may have closed a human node since the agent read the plan (both write
        # under the task row's lock): the agent's open copy of it does not undo that.
        nodes = keep_person_closed(nodes, previous)
    problems += rules.check_update(nodes, previous)
    problems += reserved_request_id_problems(raw_request_id)
    if draft is not None:
        problems += rules.retry_edge_problems(nodes, draft.edges, previous, previous_edges)
    # The ids of a refused plan's nodes are looked up too (every problem is reported at once),
    # but only those that are ids at all: no store can be asked about a NUL or a lone surrogate.
    # Only the plan's own task's actions count: another task's approval backs nothing here.
    named = [n.get("action_id") for n in [*nodes, *(previous or [])] if isinstance(n, dict)]
    task_id = fence.task_id if fence is not None else session.task_id
    named_actions = task_plans.task_actions(conn, task_id, [a for a in named if _is_id(a)])
    problems += authority_problems(
        nodes,
        previous,
        writer=writer,
        action_statuses={a: status for a, (status, _) in named_actions.items()},
        action_nodes={a: node_id for a, (_, node_id) in named_actions.items()},
    )
    if fence is not None and writer == "agent":
        # Invariant 21: what an execution's agent completes rests on what the host recorded.
        cited = [i for i in cited_ids(nodes, previous) if _is_id(i)]
        known, writes = task_plans.cited_records(conn, fence.task_id, cited)
        problems += citation_problems(nodes, previous, evidence=known, writes=writes)
    rules.raise_problems(problems)
    assert draft is not None  # no problem was found, so the draft exists
    record = PlanRecord(
        session_id=session_id,
        revision=context.latest_revision + 1,
        request_id=draft.request_id,
        schema_version=rules.SCHEMA_VERSION,
        title=draft.title,
        reason=draft.reason,
        nodes=nodes,
        edges=draft.edges,
        content_digest=draft.digest,
        task_id=fence.task_id if fence else session.task_id,
        generation=fence.generation if fence else session.generation,
        updated_at=now or utcnow(),
        # Computed here, from the revision the rules above were checked against: which of its
        # failed nodes the new nodes retry is history no later revision can show. From the
        # nodes as drawn: a node drawn after one the agent still saw open, which a person
        # failed meanwhile (`keep_person_closed` keeps the failure), was drawn as a
        # succession; it retries nothing, and the failure stays news for the agent.
        retries=next_retries(
            drawn,
            draft.edges,
            previous_nodes=previous,
            previous_edges=previous_edges,
            previous_retries=previous_retries,
        ),
    )
    store.insert_revision(conn, record)
    if session.purpose == "task_execution" and record.task_id and record.generation:
        # The task stream's log: one event per revision of a task's execution, same commit.
        event_store.record_event(
            conn,
            record.task_id,
            "plan_revision",
            generation=record.generation,
            reason=record.reason,
            data={"session_id": session_id, "revision": record.revision},
            task_locked=fence is not None,  # the fence check holds the task row
        )
    return PublishResult(record, created=True)


def _check_writer(session: session_store.SessionRecord, fence: Fence | None) -> None:
    """Invariant 9: the plan of an execution's session is written only by that execution, under
    its fence; other sessions (chats, collaborations) take publishes without one."""
    if fence is None:
        if session.purpose == "task_execution":
            raise ConflictError(
                f"session {session.session_id} belongs to an execution of task "
                f"{session.task_id}: a publish to it must carry that execution's fence "
                "(task_id, generation, lease_token)",
                code="fence_required",
            )
        return
    if session.task_id != fence.task_id or session.generation != fence.generation:
        raise ConflictError(
            f"session {session.session_id} is not the session of generation "
            f"{fence.generation} of task {fence.task_id}",
            code="session_mismatch",
        )


def _is_id(value: Any, limit: int = rules.MAX_ID) -> TypeGuard[str]:
    """Whether `value` passes the id check (a request, node, action or evidence id)."""
    return (
        isinstance(value, str)
        and len(value) <= limit
        and rules.ID_PATTERN.fullmatch(value) is not None
    )


def _raw_nodes(payload: Any) -> list[Any]:
    nodes = payload.get("nodes") if isinstance(payload, dict) else None
    return nodes if isinstance(nodes, list) else []


class PlanService:
    """Plans over one `Database`; `notifier` hears of every new revision after its commit."""

    def __init__(
        self,
        db: Database,
        notifier: PlanNotifier | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.notifier: PlanNotifier = notifier or NullNotifier()
        self.clock = clock

    def publish_execution_plan(
        self,
        session_id: str,
        payload: Any,
        *,
        fence: Fence | None = None,
        after_commit: AfterCommit | None = None,
        writer: Writer = "agent",
    ) -> PublishResult:
        """Validate and store a new revision, or return the stored one for a replayed request_id.

        Raises `ValidationFailed` (every problem in `details`), `ConflictError`
        (`request_id_conflict`, `session_mismatch`) or `StaleGeneration`; then nothing was written.
        """
        with self.db.transaction() as conn:
            result = publish_txn(
                conn, session_id, payload, fence=fence, now=self.clock(), writer=writer
            )
        if result.created:
            self.notify(result.plan)
        if after_commit is not None:
            after_commit(result)
        return result

    def notify(self, plan: PlanRecord) -> None:
        """Wake the streams of the plan's session; never raises (the revision is committed)."""
        try:
            self.notifier.notify(plan.session_id, plan.revision)
        except Exception:
            log.exception("plan wake-up for session %s failed", plan.session_id)

    def _session_or_404(self, conn: Connection, session_id: str) -> session_store.SessionRecord:
        session = session_store.get_session(conn, session_id)
        if session is None:
            raise NotFound(f"session {echoed(session_id)} does not exist")
        return session

    def history(self, session_id: str) -> dict[str, Any]:
        """`{"session_id", "latest", "revisions": [summaries, oldest first]}`."""
        with self.db.transaction(readonly=True) as conn:
            self._session_or_404(conn, session_id)
            latest = store.latest_revision(conn, session_id)
            summaries = store.list_summaries(conn, session_id)
        return {
            "session_id": session_id,
            "latest": latest.to_dict() if latest else None,
            "revisions": summaries,
        }

    def revision(self, session_id: str, revision: int) -> PlanRecord:
        with self.db.transaction(readonly=True) as conn:
            self._session_or_404(conn, session_id)
            record = store.get_revision(conn, session_id, revision)
        if record is None:
            raise NotFound(f"session {echoed(session_id)} has no plan revision {revision}")
        return record

    def latest(self, session_id: str) -> PlanRecord | None:
        with self.db.transaction(readonly=True) as conn:
            self._session_or_404(conn, session_id)
            return store.latest_revision(conn, session_id)

    def state(self, session_id: str) -> SessionPlans:
        """The snapshot a stream opens with."""
        with self.db.transaction(readonly=True) as conn:
            standing = store.session_standing(conn, session_id)
            if standing is None:
                raise NotFound(f"session {echoed(session_id)} does not exist")
            latest = store.latest_revision(conn, session_id)
        return SessionPlans(session_id, standing.running, latest, standing.finished)

    def revisions_after(self, session_id: str, after: int, limit: int = 100) -> list[PlanRecord]:
        """Committed revisions above `after`, oldest first."""
        with self.db.transaction(readonly=True) as conn:
            return store.revisions_after(conn, session_id, after, limit)

    def takes_writes(self, session_id: str) -> bool:
        """Whether a revision may still be written to the session: False once it is deleted
        (a chat's retention) or finished (`store.plans.session_standing`)."""
        with self.db.transaction(readonly=True) as conn:
            standing = store.session_standing(conn, session_id)
        return standing is not None and not standing.finished

    def latest_number(self, session_id: str) -> int:
        with self.db.transaction(readonly=True) as conn:
            return store.latest_revision_number(conn, session_id)
