"""What the task stream shows: a snapshot, then the task's event log in commit order.

The log (`task_events`) is written in the transaction of each change, with a per-task `seq`
allocated under the task row lock: a client that saw event n has seen every change committed
before it, and `Last-Event-ID: n` resumes at n + 1 after any reconnect or API restart. Plan
revisions are logged by reference and read here, so the stream shows the stored revision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.domain.times import wire_time
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.errors import NotFound, echoed
from orchestrator.store import actions as action_store
from orchestrator.store import plans as plan_store
from orchestrator.store import task_events as event_store
from orchestrator.store import task_plans
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database

__all__ = ["STATUS_EVENTS", "StreamEvent", "TaskSnapshot", "TaskStreamService"]

#: Log entries shown as `status` events.
STATUS_EVENTS: Final = ("queued", "waiting", "completed", "failed", "cancelled")
#: The largest revision the store's column holds (an INTEGER on Postgres).
_MAX_REVISION: Final = 2**31 - 1


@dataclass(frozen=True)
class TaskSnapshot:
    data: dict[str, Any]
    last_seq: int
    final: bool


@dataclass(frozen=True)
class StreamEvent:
    seq: int
    name: str  # the SSE event name
    data: dict[str, Any]
    final: bool  # a final status: the stream ends after it


class TaskStreamService:
    def __init__(self, db: Database) -> None:
        self.db = db

    def snapshot(self, task_id: str) -> TaskSnapshot:
        """Status, generation, current plan and pending actions; `last_seq` is read first, so
        the snapshot is at least as new as it (a change after it is sent again, never lost)."""
        with self.db.transaction(readonly=True) as conn:
            seq = event_store.last_seq(conn, task_id)
            task = task_store.get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            plan = plan_store.latest_revision(conn, task.session_id) if task.session_id else None
            if plan is None:
                # The generation has not published yet: the task's current plan is the last one
                # published (invariant 22: the next publish keeps it), whichever session holds it.
                plan = task_plans.task_latest_plan(conn, task_id)
            pending = action_store.list_actions(
                conn, status="pending_approval", task_id=task_id, limit=200
            )
        data = {
            "task_id": task.task_id,
            "status": task.status,
            "generation": task.generation,
            "reason": task.last_error,
            "plan": plan.to_dict() if plan else None,
            "pending_actions": [action.to_dict() for action in pending],
            "last_event_id": seq,
        }
        return TaskSnapshot(data, seq, task.status in TERMINAL_TASK_STATUSES)

    def finished_after(self, snapshot: TaskSnapshot, task_id: str, after: int) -> bool:
        """Whether a client that saw event `after` has seen everything: the task is finished
        and no event follows (read again: the snapshot's `last_seq` may predate its status)."""
        if not snapshot.final:
            return False
        with self.db.transaction(readonly=True) as conn:
            newest = event_store.last_seq(conn, task_id)
        return after >= newest

    def events_after(self, task_id: str, after: int, limit: int = 100) -> list[StreamEvent]:
        with self.db.transaction(readonly=True) as conn:
            out = []
            for event in event_store.events_after(conn, task_id, after, limit):
                base = {
                    "seq": event.seq,
                    "type": event.type,
                    "generation": event.generation,
                    "status": event.status,
                    "reason": event.reason,
                    "time": wire_time(event.created_at),
                }
                if event.type == "plan_revision":
                    ref = _revision_ref(event.data)
                    plan = plan_store.get_revision(conn, *ref) if ref is not None else None
                    base["plan"] = plan.to_dict() if plan else None
                    out.append(StreamEvent(event.seq, "execution_plan", base, final=False))
                elif event.type in STATUS_EVENTS:
                    final = event.type in TERMINAL_TASK_STATUSES
                    out.append(StreamEvent(event.seq, "status", base, final=final))
                elif isinstance(event.data, dict):
                    base.update(event.data)
                    out.append(StreamEvent(event.seq, event.type, base, final=False))
                else:  # stored in another shape by an older version or a hand edit
                    base["data"] = json.dumps(event.data, ensure_ascii=False, default=str)
                    out.append(StreamEvent(event.seq, event.type, base, final=False))
            return out


def _revision_ref(data: Any) -> tuple[str, int] | None:
    """The plan revision a `plan_revision` event names; None when it names none readably (an
    event an older version or a hand edit stored in another shape: sent with no plan rather
    than ending the stream)."""
    if not isinstance(data, dict):
        return None
    session_id, revision = data.get("session_id"), data.get("revision")
    if isinstance(revision, str) and revision.isascii() and revision.isdigit():
        revision = int(revision)  # not "²", a digit to isdigit() that int() refuses
    if (
        not isinstance(session_id, str)
        or not isinstance(revision, int)
        or isinstance(revision, bool)
        or not 1 <= revision <= _MAX_REVISION  # no store is asked past its column
    ):
        return None
    return session_id, revision
