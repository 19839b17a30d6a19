"""The operator's view of one task (`tasks show`, `GET /api/v1/tasks/{id}`): its generations and
why each was queued, its lease, plan, report, pending approvals, receipts, recovery snapshot,
deliveries, token usage; and the version of that view the API tags it by.

It reads plans, reports, transcripts, recovery snapshots, deliveries and receipts, none of which a
trigger, a requeue or a listing reads: `TaskService.explain` and `view_version` import this module
when first asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.domain.times import wire_time
from orchestrator.errors import NotFound, echoed
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.leases.keys import task_lease
from orchestrator.services.recovery import snapshot_for
from orchestrator.services.task_transcripts import usage_view
from orchestrator.services.task_views import task_view, wake_up_unsent
from orchestrator.store import executions as execution_store
from orchestrator.store import outbox_views, task_versions
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store import task_events as event_store
from orchestrator.store import tasks as task_store
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.last_write import last_fenced_write

if TYPE_CHECKING:
    from orchestrator.store.db import Database
    from orchestrator.store.receipts import ReceiptLedger
    from orchestrator.store.records import ExecutionRecord, TaskRecord

__all__ = ["RESOLUTIONS_SHOWN", "explain", "view_version"]

#: How many of a task's write resolutions its view shows (the newest; the task stream and the
#: webhooks carry every one).
RESOLUTIONS_SHOWN = 50


def explain(
    db: Database,
    task_id: str,
    *,
    leases: LeaseBackend | None = None,
    ledger: ReceiptLedger | None = None,
) -> dict[str, Any]:
    """The operator's view of one task: generations, lease, plan, report, what is pending
    (without `leases`, no lease; without `ledger`, no receipts)."""
    with db.transaction(readonly=True) as conn:
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
            "lease": _lease(leases, task, current[0] if current else None),
            "executions": [
                execution.to_dict() | {"queued_because": because.get(execution.generation)}
                for execution in executions
            ],
            "plan": plan.to_dict() if plan else None,
            "report": report,
            "pending_actions": pending,
            "unknown_receipts": _unknown_receipts(ledger, task_id),
            "token_usage": usage_view(usage),
            "recovery": recovery.to_dict() if recovery is not None else None,
            "running_receipts": _unknown_receipts(ledger, task_id, "running"),
            "deliveries": deliveries,
            "resolutions": [_resolution_view(event) for event in resolved],
            "last_write": {"at": last_write[0], "kind": last_write[1]} if last_write else None,
            "waiting_on": waited[-1].reason if waited else None,
            "wake_up_unsent": wake_up_unsent(task),
        }
    )
    return view


def view_version(
    db: Database, task_id: str, *, leases: LeaseBackend | None = None
) -> tuple[Any, ...] | None:
    """What `explain(task_id)` is built from, summed up in one statement (and a running
    task's lease as its back end holds it): equal versions, equal views. None when there
    is no such task. Read before the view, so a tag never names a newer view than its own."""
    with db.transaction(readonly=True) as conn:
        row = task_versions.view_version(conn, task_id)
    if row is None:
        return None
    lease: tuple[Any, ...] | None = None
    if row.status == "running" and leases is not None:
        try:
            info = leases.get(task_lease(task_id))
        except LeaseBackendUnavailable:  # the view shows the store's mirror: its own tag
            return (*row, ("lease back end unavailable",))
        # Not its expiry: read as the server's countdown from now, it moves at each read.
        lease = (info.holder, info.token, info.renewed_at) if info is not None else None
    return (*row, lease)


def _lease(
    leases: LeaseBackend | None, task: TaskRecord, current: ExecutionRecord | None
) -> dict[str, Any] | None:
    """The running generation's lease as the lease back end holds it; else (Redis restarted
    empty, flushed, or away) the store's mirror of it, marked `source: store`: the round
    goes on, and its heartbeat takes the lease back at its next renewal (or the sweeper
    requeues the task once the mirror expires). Before, the view said no lease, or failed
    altogether with Redis away."""
    if leases is None or task.status != "running":
        return None
    try:
        info = leases.get(task_lease(task.task_id))
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


def _unknown_receipts(
    ledger: ReceiptLedger | None, task_id: str, status: str = "unknown"
) -> list[dict[str, Any]]:
    if ledger is None:
        return []
    owner = f"task:{task_id}"
    return [r.public() for r in ledger.unknown_for_owner(owner, status=status)]


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
