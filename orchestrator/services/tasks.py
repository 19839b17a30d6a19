"""Triggers and operator commands on tasks: trigger, list, requeue, cancel.

The task service is the one the runtime hands out for tasks; it also answers a task's explain
view and its transcript, read by `task_explain` and `task_transcripts`, which it imports when
first asked: a trigger, a requeue or `tasks list` does not import the dozen store modules those
read (about 40 ms of each CLI start).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import update

from orchestrator.domain.cursors import decode_cursor, encode_cursor
from orchestrator.domain.storable import filled_text, storable_json
from orchestrator.domain.task_filter import TASK_TYPE_PATTERN, TaskFilter
from orchestrator.domain.vocabulary import TASK_STATUSES, TERMINAL_TASK_STATUSES
from orchestrator.errors import ConflictError, InvalidTransition, NotFound, echoed
from orchestrator.leases.keys import ended_key
from orchestrator.services.dispatch import (
    Dispatcher,
    WakeUp,
    dispatch_failure,
    record_unsent,
    wake,
)
from orchestrator.services.task_views import task_view, wake_up_unsent
from orchestrator.store import action_notices as notice_store
from orchestrator.store import executions as execution_store
from orchestrator.store import generations as generation_store
from orchestrator.store import task_events as event_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database, wake_after_commit
from orchestrator.store.records import ExecutionRecord, TaskRecord
from orchestrator.store.tables import tasks
from orchestrator.store.types import utcnow

if TYPE_CHECKING:
    from orchestrator.leases import LeaseBackend

__all__ = ["CANCELLED", "Requeued", "TaskService", "Trigger", "TriggerResult"]

_ID_PATTERN = TASK_TYPE_PATTERN

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
        *,
        receipts: bool = False,
    ) -> None:
        """`receipts`: the explain view lists the task's unknown and running receipts (read
        through a `ReceiptLedger` built at the first view: a trigger, a requeue or a listing
        has no use for its module)."""
        self.db = db
        self.dispatcher = dispatcher
        self.leases = leases
        self.receipts = receipts

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
        """The operator's view of one task: generations, lease, plan, report, what is pending
        (`task_explain`, imported at the first view: a trigger or a listing reads none)."""
        from orchestrator.services import task_explain
        from orchestrator.store.receipts import ReceiptLedger

        ledger = ReceiptLedger(self.db) if self.receipts else None
        return task_explain.explain(self.db, task_id, leases=self.leases, ledger=ledger)

    def view_version(self, task_id: str) -> tuple[Any, ...] | None:
        """What `explain(task_id)` is built from, summed up: equal versions, equal views; None
        when there is no such task (`task_explain.view_version`)."""
        from orchestrator.services import task_explain

        return task_explain.view_version(self.db, task_id, leases=self.leases)

    def transcript(
        self,
        task_id: str,
        generation: int | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """The durable transcript of a task, oldest entry first (`task_transcripts.transcript`,
        imported at the first read)."""
        from orchestrator.services import task_transcripts

        return task_transcripts.transcript(self.db, task_id, generation, limit=limit, cursor=cursor)

    def transcript_version(
        self, task_id: str, generation: int | None = None, *, limit: int, cursor: str | None = None
    ) -> tuple[Any, ...] | None:
        """What `transcript(...)` with the same arguments would answer, summed up; None when it
        would be a 404 (`task_transcripts.transcript_version`)."""
        from orchestrator.services import task_transcripts

        return task_transcripts.transcript_version(
            self.db, task_id, generation, limit=limit, cursor=cursor
        )


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
