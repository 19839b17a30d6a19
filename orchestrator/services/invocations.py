"""An operator settles a task's write that the host cannot: `unknown` or `pending` becomes
`succeeded` or `failed` (`orchestrator invocations resolve`, and
`POST /api/v1/invocations/{id}/resolve`).

An `unknown` write without a verifier answers "verify first" in every later round of its intent
round, and a 202 stays `pending`; only a person who looked at the target system can say what
happened. The resolution is one transaction, in the lock order of every fenced write (the task
row, then the receipt):

- a compare-and-set on the status: only `unknown` or `pending` move, so of two operators racing
  one wins and the other is refused (409 `not_resolvable`); a `succeeded` receipt, which a
  completed node may cite, never becomes `failed`;
- a task event `invocation_resolved` naming the operator, the receipt, both statuses and the
  reason (the receipt keeps a fixed host text, as seed 000 wants of every receipt summary);
- the task is never completed by it. A `waiting` task with nothing else open (no other open
  write, pending action or open human node) queues its next generation in the same intent
  round (`redecide_txn`), whose round ends through the decision table again: it completes only
  if no write is open then, and its completed nodes cite only succeeded writes. A task in
  any other status reads the receipt when its round ends, or not at all (a finished one).

In the same intent round the identical write then answers from the receipt (`succeeded`: not
sent again; `failed`: not sent again, as any failed write); a requeue may send it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.domain.storable import NAME_MAX
from orchestrator.errors import ConflictError, NotFound, ValidationFailed, echoed
from orchestrator.services.dispatch import Dispatcher, WakeUp, wake
from orchestrator.services.redecide import redecide_txn
from orchestrator.store import open_work
from orchestrator.store import task_events as event_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.receipts import Receipt

__all__ = ["REASON_MAX", "InvocationService", "Resolution"]

#: The longest reason an operator may give (as a requeue's).
REASON_MAX = 500


@dataclass(frozen=True)
class Resolution:
    """What a resolution did: the receipt after it, and where its task stands."""

    receipt: Receipt
    previous_status: str
    by: str
    reason: str
    task_id: str
    task_status: str
    generation: int
    queued_generation: int | None  # the generation queued at once, when the task waited on it
    #: What became of that generation's wake-up; None when none was queued.
    wake_up: WakeUp | None = None


class InvocationService:
    def __init__(self, db: Database, dispatcher: Dispatcher) -> None:
        self.db = db
        self.dispatcher = dispatcher

    def resolve(self, invocation_id: str, status: str, *, by: str, reason: str) -> Resolution:
        """Settle an `unknown` or `pending` write of a task as `status` (`succeeded`, `failed`).

        Refused: 422 `invalid_request` (status, reason, by), 404 `not_found`, 409
        `not_task_write` (not a task's receipt), 409 `not_resolvable` (any other status, or
        resolved meanwhile), 409 `round_running` (its generation's round still runs); then
        nothing was written.
        """
        _check(status, by, reason)
        with self.db.transaction() as conn:
            row = open_work.receipt_row(conn, invocation_id)  # its task is locked first
            if row is None:
                raise NotFound(f"no invocation {echoed(invocation_id)}")
            task_id = open_work.task_of_owner(row.owner)
            task = task_store.get_task(conn, task_id, lock=True) if task_id else None
            if task_id is None or task is None:
                raise ConflictError(
                    f"invocation {invocation_id} is not a write of a task: only a task's writes "
                    "are resolved (their task's events record who and why)",
                    code="not_task_write",
                )
            # Read again under the task's lock (the lock order of every fenced write).
            row = open_work.receipt_row(conn, invocation_id, lock=True)
            assert row is not None  # a receipt is deleted only with a finished status
            previous = str(row.status)
            if previous not in open_work.RESOLVABLE:
                raise _not_resolvable(invocation_id, previous)
            if task.status == "running" and row.session_id == task.session_id:
                # Its round still runs: it settles its own writes (a background command's end,
                # a verification), and a resolution now could not be corrected by what it sees.
                raise ConflictError(
                    f"invocation {invocation_id} belongs to generation {task.generation} of task "
                    f"{task.task_id}, whose round is still running: resolve it once the round "
                    "has ended",
                    code="round_running",
                )
            if not open_work.resolve_open_write(conn, invocation_id, previous, status):
                raise _not_resolvable(invocation_id, previous)
            event_store.record_event(
                conn,
                task.task_id,
                "invocation_resolved",
                reason=(
                    f"{by} resolved {row.tool_name} {invocation_id} from {previous} to "
                    f"{status}: {reason}"
                ),
                data={
                    "invocation_id": invocation_id,
                    "tool_name": row.tool_name,
                    "previous_status": previous,
                    "resolved_status": status,
                    "by": by,
                    "note": reason,
                },
                task_locked=True,
            )
            queued = None
            if task.status == "waiting" and not open_work.open_writes(conn, task.task_id, 1):
                queued = redecide_txn(conn, task)
            after = task_store.get_task(conn, task.task_id)
            resolved = open_work.receipt_row(conn, invocation_id)
            assert after is not None
            assert resolved is not None
        wake_up = None
        if queued is not None:
            wake_up = wake(self.db, self.dispatcher, after.task_id, queued)
        return Resolution(
            receipt=Receipt.from_row(resolved),
            previous_status=previous,
            by=by,
            reason=reason,
            task_id=after.task_id,
            task_status=after.status,
            generation=after.generation,
            queued_generation=queued,
            wake_up=wake_up,
        )


def _check(status: str, by: str, reason: str) -> None:
    problems = []
    if status not in open_work.RESOLUTIONS:
        problems.append(("status", f"status must be succeeded or failed, not {status!r}"))
    if not by.strip() or len(by) > NAME_MAX:
        problems.append(("by", f"by must name who resolves it (1-{NAME_MAX} characters)"))
    if not reason.strip() or len(reason) > REASON_MAX:
        problems.append(("reason", f"reason must say why (1-{REASON_MAX} characters)"))
    if problems:
        raise ValidationFailed(
            problems[0][1],
            code="invalid_request",
            details=[
                {"code": "invalid_request", "message": message, "field": field}
                for field, message in problems
            ],
        )


def _not_resolvable(invocation_id: str, status: str) -> ConflictError:
    message = (
        f"invocation {invocation_id} is {status}: only an unknown or pending write can be "
        "resolved (a running one is still in its round's hands; a succeeded or failed one is "
        "settled)"
    )
    return ConflictError(
        message,
        code="not_resolvable",
        details=[
            {
                "code": "not_resolvable",
                "message": f"the receipt is {status}",
                "invocation_id": invocation_id,
                "status": status,
            },
        ],
    )
