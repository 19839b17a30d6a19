"""A task as list, show, a trigger's and a requeue's answers print it: its fields, whether its
worker handed its round back, whether its wake-up is unsent.

Records in, dicts out, no store read: the API's routes, the CLI's commands, the task service's
pages and the explain view (`task_explain`) all build a task's fields here, so they say alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.store.records import ExecutionRecord, TaskRecord

__all__ = ["task_view", "wake_up_unsent"]


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
