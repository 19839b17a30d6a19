"""Triggers and operator commands on tasks: trigger, list, explain, requeue, cancel."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import update

from orchestrator.domain.cursors import (
    decode_cursor,
    decode_position,
    encode_cursor,
    encode_position,
    invalid_cursor,
)
from orchestrator.domain.storable import filled_text, storable_json
from orchestrator.domain.task_filter import TASK_TYPE_PATTERN, TaskFilter
from orchestrator.domain.times import wire_time
from orchestrator.domain.vocabulary import TASK_STATUSES, TERMINAL_TASK_STATUSES
from orchestrator.errors import ConflictError, InvalidTransition, NotFound, echoed
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.leases.keys import ended_key, task_lease
from orchestrator.services.dispatch import (
    Dispatcher,
    WakeUp,
    dispatch_failure,
    record_unsent,
    wake,
)
from orchestrator.services.recovery import snapshot_for
from orchestrator.store import action_notices as notice_store
from orchestrator.store import executions as execution_store
from orchestrator.store import generations as generation_store
from orchestrator.store import outbox_views, task_versions
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store import task_events as event_store
from orchestrator.store import tasks as task_store
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.db import Database, wake_after_commit
from orchestrator.store.last_write import last_fenced_write
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.records import ExecutionRecord, TaskRecord
from orchestrator.store.tables import tasks
from orchestrator.store.types import utcnow

__all__ = ["CANCELLED", "Requeued", "TaskService", "Trigger", "TriggerResult"]

_ID_PATTERN = TASK_TYPE_PATTERN

#: How many of a task's write resolutions its view shows (the newest; the task stream and the
#: webhooks carry every one).
RESOLUTIONS_SHOWN = 50

#: A cancel's reason when the operator gives none; with a name, "cancelled by NAME".
CANCELLED = "cancelled by an operator"


class Trigger(BaseModel):
    """What the business backend sends to start a task."""

    model_config = ConfigDict(extra="forbid")

    task_type: str = Field(min_length=1, max_length=64, pattern=_ID_PATTERN)
    title: str = Field(min_length=1, max_length=200)
    context: dict[str, Any] = Field(default_factory=dict)
    trigger_id: str | None = Field(default=None, min_length=1, max_length=128)
    sample_input: dict[str, Any] | None = None

    # Postgres refuses these values and SQLite would keep them for a worker to trip on: both
    # stores refuse them here alike, as a 422 naming the field (and one CLI line).
    @field_validator("title", "trigger_id")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return None if value is None else filled_text(value)

    @field_validator("context", "sample_input")
    @classmethod
    def _json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else storable_json(value)


@dataclass(frozen=True)
class TriggerResult:
    task: TaskRecord
    created: bool
    #: False when the wake-up could not be sent (broker down): the task is queued all the same,
    #: the store records it, and the sweeper sends it at its first sweep the broker answers.
    dispatched: bool = True
    #: Why the broker did not take it (the error's type and first line), when it did not.
    dispatch_error: str | None = None
    #: False when the store did not take that record either: the sweeper then republishes the
    #: wake-up after ORCH_QUEUED_STALE_SECONDS.
    unsent_recorded: bool = True


@dataclass(frozen=True)
class Requeued:
    """A requeue: the task after it, and whether the broker took its new generation's wake-up
    (a refused one is sent by the next sweep: the CLI and the API say so)."""

    task: TaskRecord
    wake_up: WakeUp


class TaskService:
    def __init__(
        self,
        db: Database,
        dispatcher: Dispatcher,
        leases: LeaseBackend | None = None,
        ledger: ReceiptLedger | None = None,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.leases = leases
        self.ledger = ledger

    def trigger(self, trigger: Trigger) -> TriggerResult:
        """Create and queue a task; the same `trigger_id` again returns the same task."""
        trigger_id = trigger.trigger_id or f"auto:{_new_uuid()}"
        task = task_store.insert_task_alone(  # one statement on Postgres
            self.db,
            task_store.NewTask(
                task_type=trigger.task_type,
                title=trigger.title,
                context=trigger.context,
                trigger_id=trigger_id,
                sample_input=trigger.sample_input,
            ),
        )
        if task is None:
            with self.db.transaction(readonly=True) as conn:
                existing = task_store.task_by_trigger(conn, trigger_id)
            assert existing is not None  # trigger ids are never deleted on their own
            _refuse_other_payload(trigger_id, existing, trigger)
            # Nothing is sent again: a retried trigger says what its first answer said, and
            # `false` while the broker has still not taken the wake-up (the sweeper sends it).
            return TriggerResult(existing, created=False, dispatched=not wake_up_unsent(existing))
        failure = dispatch_failure(self.dispatcher, task.task_id, task.generation)
        if failure is None:  # the benchmarked path: nothing more
            return TriggerResult(task, created=True)
        recorded = record_unsent(self.db, [(task.task_id, task.generation)])
        return TriggerResult(
            task, created=True, dispatched=False, dispatch_error=failure, unsent_recorded=recorded
        )

    def get(self, task_id: str) -> TaskRecord:
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
        if task is None:
            raise NotFound(f"task {echoed(task_id)} does not exist")
        return task

    def list_tasks(
        self, *, where: TaskFilter | None = None, limit: int = 50, cursor: str | None = None
    ) -> list[TaskRecord]:
        """Newest first, without contexts; `cursor` continues after a `page_tasks` page of the
        same filter (build `where` with `task_filter`, which checks it)."""
        after = decode_cursor(cursor) if cursor else None
        with self.db.transaction(readonly=True) as conn:
            where = where or TaskFilter()
            return task_store.list_tasks(conn, where=where, limit=limit, after=after)

    def page_tasks(
        self, *, where: TaskFilter | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[TaskRecord], str | None]:
        """One page and the cursor of the next (None on the last page)."""
        rows = self.list_tasks(where=where, limit=limit + 1, cursor=cursor)
        items = rows[:limit]
        more = len(rows) > limit and items
        return items, encode_cursor(items[-1].created_at, items[-1].task_id) if more else None

    def views(
        self, found: list[TaskRecord], waits: dict[str, ExecutionRecord] | None = None
    ) -> list[dict[str, Any]]:
        """`task_view` of each, with `handed_back` read for the running ones in one query
        (unless given, as `handed_back` reads it), and whether its wake-up is unsent."""
        waits = self.handed_back(found) if waits is None else waits
        return [
            task_view(task, waits.get(task.task_id)) | {"wake_up_unsent": wake_up_unsent(task)}
            for task in found
        ]

    def handed_back(self, found: list[TaskRecord]) -> dict[str, ExecutionRecord]:
        """The current generation of each running task of `found` that its worker handed back."""
        running = [(t.task_id, t.generation) for t in found if t.status == "running"]
        with self.db.transaction(readonly=True) as conn:
            return execution_store.handed_back(conn, running)

    def requeue(self, task_id: str, reason: str, *, by: str | None = None) -> TaskRecord:
        """A new generation now; a running one is superseded and fenced out. `by` is who asked
        (an account, the CLI's user; None: the shared API token named no one)."""
        return self.requeue_and_wake(task_id, reason, by=by).task

    def requeue_and_wake(self, task_id: str, reason: str, *, by: str | None = None) -> Requeued:
        """`requeue`, answering with what became of the new generation's wake-up."""
        said = f"requeued by {by or 'an operator'}: {reason}"
        with self.db.transaction() as conn:
            task = task_store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            generation_store.end_generation(
                conn,
                task_id,
                task.generation,
                outcome="superseded",
                reason=said,
            )
            generation_store.supersede_pending_actions(conn, task_id, "superseded by a requeue")
            nxt = generation_store.requeue_generation(
                conn,
                task_id,
                task.generation,
                title=task.title,
                from_statuses=TASK_STATUSES,
                recoveries=0,
                rounds=0,
                new_intent=True,
            )
            assert nxt is not None  # the row lock keeps the generation ours
            event_store.record_event(
                conn, task_id, "queued", generation=nxt, reason=said, data=_by(by)
            )
            wake_after_commit(conn, ended_key(task_id))  # the superseded round stops at once
            # What this requeue did, read in its own transaction: a cancel that commits just
            # after it must not make the requeue's answer say "cancelled".
            requeued = task_store.get_task(conn, task_id)
        wake_up = wake(self.db, self.dispatcher, task_id, nxt)
        assert requeued is not None
        return Requeued(requeued, wake_up)

    def cancel(self, task_id: str, reason: str = CANCELLED, *, by: str | None = None) -> TaskRecord:
        """Fence the live generation and mark the task cancelled. `by` is who asked (as for
        `requeue`): the reason the task keeps names them."""
        if by is not None:
            reason = f"cancelled by {by}" if reason == CANCELLED else f"cancelled by {by}: {reason}"
        with self.db.transaction() as conn:
            task = task_store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            if task.status in TERMINAL_TASK_STATUSES:
                raise InvalidTransition(f"task {task_id} is already {task.status}")
            generation_store.end_generation(
                conn, task_id, task.generation, outcome="cancelled", reason=reason
            )
            generation_store.supersede_pending_actions(conn, task_id, "the task was cancelled")
            # An approval stands (it may be delivered or carried out): the backend hears of it.
            notice_store.record_cancelled_approvals(conn, task_id, reason)
            # The losses in a row are counted toward parking a task that runs on; a cancelled
            # one never runs again (it ends as a settled round ends: both reset). Its
            # generations still show every loss.
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id)
                .values(
                    status="cancelled",
                    last_error=reason,
                    recoveries=0,
                    handbacks=0,
                    updated_at=utcnow(),
                )
            )
            event_store.record_event(conn, task_id, "cancelled", reason=reason, data=_by(by))
            wake_after_commit(conn, ended_key(task_id))  # its worker stops the round at once
            cancelled = task_store.get_task(conn, task_id)  # as this transaction left it
        assert cancelled is not None
        return cancelled

    def explain(self, task_id: str) -> dict[str, Any]:
        """The operator's view of one task: generations, lease, plan, report, what is pending."""
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            executions = execution_store.list_executions(conn, task_id)
            plan = plan_store.latest_revision(conn, task.session_id) if task.session_id else None
            report = report_store.latest_report(conn, task_id, task.generation)
            pending = report_store.pending_actions_of_generation(conn, task_id, task.generation)
            usage = transcript_store.usage_of(conn, task_id)
            # What the next generation continues from: the previous one's, or (once the task
            # stopped running) the last generation's own recovery snapshot.
            before = task.generation + (0 if task.status == "running" else 1)
            last = execution_store.last_started_execution(conn, task_id, before)
            recovery = snapshot_for(conn, last) if last is not None else None
            deliveries = outbox_views.delivery_summary(conn, task_id)
            resolved = event_store.events_of_type(
                conn, task_id, "invocation_resolved", RESOLUTIONS_SHOWN
            )
            last_write = last_fenced_write(conn, task_id, task.generation)
            # The execution's reason says how its round ended; a decision since (an approval,
            # a person's step) that left the task waiting said anew on what, in this event.
            # Why each generation after the first was queued: a requeue (who, why), a
            # decision, a recovery; said nowhere else once its generation has ended.
            queued = event_store.events_of_type(conn, task_id, "queued", len(executions) + 1)
            waited = (
                event_store.events_of_type(conn, task_id, "waiting", 1)
                if task.status == "waiting"
                else []
            )
        because = {event.generation: event.reason for event in queued}
        current = [x for x in executions if x.generation == task.generation]
        waits = current[0] if current and current[0].outcome is None else None
        view = task_view(task, waits if waits and waits.handed_back_at else None)
        view.update(
            {
                "lease": self._lease(task, current[0] if current else None),
                "executions": [
                    execution.to_dict() | {"queued_because": because.get(execution.generation)}
                    for execution in executions
                ],
                "plan": plan.to_dict() if plan else None,
                "report": report,
                "pending_actions": pending,
                "unknown_receipts": self._unknown_receipts(task_id),
                "token_usage": usage_view(usage),
                "recovery": recovery.to_dict() if recovery is not None else None,
                "running_receipts": self._unknown_receipts(task_id, "running"),
                "deliveries": deliveries,
                "resolutions": [_resolution_view(event) for event in resolved],
                "last_write": {"at": last_write[0], "kind": last_write[1]} if last_write else None,
                "waiting_on": waited[-1].reason if waited else None,
                "wake_up_unsent": wake_up_unsent(task),
            }
        )
        return view

    def view_version(self, task_id: str) -> tuple[Any, ...] | None:
        """What `explain(task_id)` is built from, summed up in one statement (and a running
        task's lease as its back end holds it): equal versions, equal views. None when there
        is no such task. Read before the view, so a tag never names a newer view than its own."""
        with self.db.transaction(readonly=True) as conn:
            row = task_versions.view_version(conn, task_id)
        if row is None:
            return None
        lease: tuple[Any, ...] | None = None
        if row.status == "running" and self.leases is not None:
            try:
                info = self.leases.get(task_lease(task_id))
            except LeaseBackendUnavailable:  # the view shows the store's mirror: its own tag
                return (*row, ("lease back end unavailable",))
            # Not its expiry: read as the server's countdown from now, it moves at each read.
            lease = (info.holder, info.token, info.renewed_at) if info is not None else None
        return (*row, lease)

    def transcript(
        self,
        task_id: str,
        generation: int | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """The durable transcript of a task (one generation, or all), oldest entry first: one
        page of `limit` entries after `cursor`, or every entry when `limit` is None."""
        after = _transcript_position(cursor, generation)
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            if generation is not None and not 1 <= generation <= task.generation:
                raise NotFound(
                    f"task {task_id} has no generation {generation} (it is at {task.generation})"
                )
            entries = transcript_store.entries_of(
                conn,
                task_id=task_id,
                generation=generation,
                after=after,
                limit=None if limit is None else limit + 1,
            )
            usage = transcript_store.usage_of(conn, task_id)
        next_cursor = None
        if limit is not None and len(entries) > limit:
            entries = entries[:limit]
            last = entries[-1]
            next_cursor = encode_position(last.generation or 0, last.seq)
        if generation is not None:
            usage = [u for u in usage if u.generation == generation]
        return {
            "task_id": task_id,
            "generation": generation,
            "items": [entry.to_dict() for entry in entries],
            "next_cursor": next_cursor,
            "token_usage": usage_view(usage),
        }

    def transcript_version(
        self, task_id: str, generation: int | None = None, *, limit: int, cursor: str | None = None
    ) -> tuple[Any, ...] | None:
        """What `transcript(...)` with the same arguments would answer, summed up from the
        index: the keys of its entries (written once, never changed) and the count of entries
        of the task, or of the generation asked for (its token usage changes only with it).
        None when it would be a 404. Refuses a cursor as `transcript` does."""
        after = _transcript_position(cursor, generation)
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
            if task is None or (generation is not None and not 1 <= generation <= task.generation):
                return None
            keys = transcript_store.entry_keys(
                conn, task_id=task_id, generation=generation, after=after, limit=limit + 1
            )
            count = transcript_store.entry_count(conn, task_id, generation)
        return (generation, limit, after, count, *keys)

    def _lease(self, task: TaskRecord, current: ExecutionRecord | None) -> dict[str, Any] | None:
        """The running generation's lease as the lease back end holds it; else (Redis restarted
        empty, flushed, or away) the store's mirror of it, marked `source: store`: the round
        goes on, and its heartbeat takes the lease back at its next renewal (or the sweeper
        requeues the task once the mirror expires). Before, the view said no lease, or failed
        altogether with Redis away."""
        if self.leases is None or task.status != "running":
            return None
        try:
            info = self.leases.get(task_lease(task.task_id))
        except LeaseBackendUnavailable:
            info = None
        if info is not None:
            return {
                "holder": info.holder,
                "expires_at": info.expires_at,
                "last_renewed_at": info.renewed_at,
                "source": "lease_backend",
            }
        if (
            current is None
            or current.outcome is not None
            or current.handed_back_at is not None  # said by `handed_back`: it holds none
            or current.lease_expires_at is None
        ):
            return None
        return {
            "holder": current.worker or "?",
            "expires_at": current.lease_expires_at,
            "last_renewed_at": None,
            "source": "store",
        }

    def _unknown_receipts(self, task_id: str, status: str = "unknown") -> list[dict[str, Any]]:
        if self.ledger is None:
            return []
        owner = f"task:{task_id}"
        return [r.public() for r in self.ledger.unknown_for_owner(owner, status=status)]


def _transcript_position(cursor: str | None, generation: int | None) -> tuple[int, int] | None:
    """The (generation, seq) a transcript page starts after, or `invalid_cursor`."""
    after = decode_position(cursor) if cursor else None
    if after is not None and generation is not None and after[0] != generation:
        raise invalid_cursor()  # a cursor of another generation's pages
    return after


def usage_view(usage: list[transcript_store.GenerationUsage]) -> dict[str, Any]:
    """Token usage per generation and the task's total."""
    return {
        "generations": [u.to_dict() for u in usage],
        "total": {
            "calls": sum(u.calls for u in usage),
            "prompt_tokens": sum(u.prompt_tokens for u in usage),
            "completion_tokens": sum(u.completion_tokens for u in usage),
        },
    }


def _resolution_view(event: event_store.TaskEvent) -> dict[str, Any]:
    """An operator's resolution of a write, from its `invocation_resolved` task event (a key an
    older event lacks is None: the API sends such a resolution as its JSON text)."""
    data = event.data if isinstance(event.data, dict) else {}
    keys = ("invocation_id", "tool_name", "previous_status", "resolved_status", "by", "note")
    return {
        "seq": event.seq,
        "at": wire_time(event.created_at),
        "generation": event.generation,
        **{key: data.get(key) for key in keys},
    }


def wake_up_unsent(task: TaskRecord) -> bool:
    """Queued, and the broker refused its wake-up (store/tasks.py: `queued_at` NULL): no worker
    was woken until the sweeper sends it. Read from the stored task only: a trigger's or a
    requeue's record is from before its wake-up was tried."""
    return task.status == "queued" and task.queued_at is None


def task_view(task: TaskRecord, handed_back: ExecutionRecord | None = None) -> dict[str, Any]:
    """The fields of a task that list and show print; `handed_back`, its current generation
    when its worker handed it back and the sweeper has not requeued it yet."""
    return {
        "task_id": task.task_id,
        "task_type": task.task_type,
        "title": task.title,
        "status": task.status,
        "failure_code": task.failure_code if task.status == "failed" else None,
        "intent_round": task.intent_round,
        "last_error": task.last_error,
        "origin": task.origin,
        "trigger_id": task.trigger_id,
        "generation": task.generation,
        "session_id": task.session_id,
        "rounds": task.rounds,
        "recoveries": task.recoveries,
        "handbacks": task.handbacks,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        # `running` says the generation is open, not that a round runs: one handed back (a
        # model server's Retry-After, an outage) waits for the sweeper, and says so here.
        "handed_back": (
            {
                "at": handed_back.handed_back_at,
                "requeue_after": handed_back.lease_expires_at,
                "reason": handed_back.reason,
            }
            if handed_back is not None
            else None
        ),
    }


def _refuse_other_payload(trigger_id: str, existing: TaskRecord, trigger: Trigger) -> None:
    """The same trigger id with another task type, title or context is not the same trigger."""
    differs = [
        name
        for name, stored, sent in (
            ("task_type", existing.task_type, trigger.task_type),
            ("title", existing.title, trigger.title),
            ("context", existing.context, trigger.context),
        )
        if stored != sent
    ]
    if differs:
        raise ConflictError(
            f"trigger_id {trigger_id} already started task {existing.task_id} with another "
            f"{', '.join(differs)}; use a new trigger_id for a new task",
            code="trigger_conflict",
            details=[
                {"code": "trigger_conflict", "message": f"{name} differs", "field": name}
                for name in differs
            ],
        )


def _new_uuid() -> str:
    return str(uuid.uuid4())


def _by(by: str | None) -> dict[str, Any] | None:
    """The event data of an operator's requeue or cancel: who asked, when anyone was named."""
    return {"by": by} if by is not None else None
