"""A person's decision moves the task at once (DESIGN §8, invariant 24).

An approval, a rejection or a human node closed by a person can be the last thing a `waiting`
task waited for. Then the next generation is queued in the same transaction (the same intent
round: the decision continues the task, it does not start it over), and the caller sends its
wake-up after the commit. A task in any other status decides for itself: a running generation
reads the decision when its round ends; a queued one reads it when it starts. So a step a
person closes in an earlier generation's plan, while the next one is queued or running without a
plan of its own, neither queues another generation nor touches the running one's fence.

A human node a person failed is news the agent must act on (retry it with a new human node that
depends on it, or report the task failed): it queues the next generation even while other human
nodes are still open (a call-back may take days; the retry should not wait for it). Only a
pending action still holds the task then: its approval belongs to the waiting generation. The
end of a round applies the same rule (`domain.decisions.awaited_human_nodes`), so a failure the
agent kept without a retry (a new human node drawn from it since it failed: a step planned after
it before it failed is none) is news there too; and an approval that releases a task
held with such a failure queues it though other human nodes are open.

A decision that leaves the task waiting writes a new `waiting` event with what it waits on now
(the wording of the end of a round, `domain.decisions.waiting_reason`).
"""

from __future__ import annotations

from sqlalchemy import Connection

from orchestrator.domain.decisions import (
    awaited_human_nodes,
    unanswered_failed_human_nodes,
    waiting_reason,
)
from orchestrator.domain.retries import retries_of
from orchestrator.store import generations as generation_store
from orchestrator.store import reports as report_store
from orchestrator.store import task_events as event_store
from orchestrator.store.records import TaskRecord

__all__ = ["redecide_txn"]


def redecide_txn(
    conn: Connection, task: TaskRecord, *, failed_node: str | None = None
) -> int | None:
    """Queue the next generation of a `waiting` task when nothing waits any more, or when a
    person has just failed its human node `failed_node` and no action is pending.

    `task` must have been read with its row locked in this transaction. Returns the queued
    generation, or None when the task keeps its status.
    """
    if task.status != "waiting":
        return None
    facts = report_store.generation_facts(conn, task.task_id, task.generation, task.session_id)
    retries = retries_of(facts.plan_nodes, facts.plan_edges, facts.plan_retries)
    # The rule the end of a round applies: the task waits for its people unless a person
    # failed a step the plan does not answer with a retry (`domain.retries`).
    awaited = awaited_human_nodes(facts.plan_nodes, retries)
    if facts.pending_actions > 0 or (failed_node is None and awaited):
        # Still waiting, on less than before: the task stream and the webhook hear what holds
        # it now, or a backend following them reads the reason the decision made stale.
        reason = waiting_reason(facts.pending_actions, awaited)
        event_store.record_event(conn, task.task_id, "waiting", reason=reason, task_locked=True)
        return None
    unanswered = unanswered_failed_human_nodes(facts.plan_nodes, retries)
    nxt = generation_store.requeue_generation(
        conn,
        task.task_id,
        task.generation,
        title=task.title,
        from_statuses=("waiting",),
        recoveries=0,
        rounds=task.rounds,
    )
    if nxt is not None:
        # The task stream and the webhooks see the move, in this transaction.
        if failed_node is not None:
            reason = (
                f"human node {failed_node} failed: the agent retries it or reports the task failed"
            )
        elif unanswered:
            reason = (
                f"human node(s) {', '.join(unanswered)} failed with no retry in the plan: the "
                "agent retries them or reports the task failed"
            )
        else:
            reason = "nothing waits any more"
        event_store.record_event(conn, task.task_id, "queued", generation=nxt, reason=reason)
    return nxt
