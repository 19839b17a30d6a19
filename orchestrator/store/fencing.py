"""Fencing: a write of an execution is applied only while its generation is the live one.

Call `check_fence(conn, fence)` inside the transaction that applies the write; it locks the task
row (Postgres) so a requeue or cancel cannot slip between the check and the write. What it read
of the locked row comes back, so the write needs no second look at the task.

Only the locked row's own columns are fresh when the check had to wait for the lock: anything
else the write depends on (a report, the latest plan) is read by a later statement, which sees
what the lock holder committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, and_, bindparam, select

from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.store import driver
from orchestrator.store.row_checks import STATUS_RUNNING_ON_T
from orchestrator.store.tables import executions, tasks

__all__ = ["LIVE_CTE", "LiveGeneration", "check_fence", "fence_params"]

#: `check_fence` as a CTE, for a write that is one statement on Postgres (sent in autocommit,
#: its own transaction): the same conditions on the task row and its execution, and the same
#: lock (`FOR UPDATE OF t`), so a requeue or cancel that commits first makes the re-checked row
#: fail and the write that selects from `live` inserts nothing. Binds :task_id, :generation
#: and :lease_token (`fence_params`).
LIVE_CTE = (
    "WITH live AS (SELECT t.task_id FROM tasks t JOIN executions e "
    "ON e.task_id = t.task_id AND e.generation = t.generation "
    f"WHERE t.task_id = :task_id AND t.generation = :generation AND {STATUS_RUNNING_ON_T} "
    "AND e.outcome IS NULL AND e.lease_token = :lease_token FOR UPDATE OF t) "
)


def fence_params(fence: Fence) -> dict[str, str | int]:
    """The binds of `LIVE_CTE`."""
    return {
        "task_id": fence.task_id,
        "generation": fence.generation,
        "lease_token": fence.lease_token,
    }


@dataclass(frozen=True)
class LiveGeneration:
    """The live generation's task row, as the fence check read it under the row lock."""

    session_id: str | None
    title: str
    rounds: int


# Built once: the check runs in front of every fenced write.
_FENCE = (
    select(
        tasks.c.status,
        tasks.c.session_id,
        tasks.c.title,
        tasks.c.rounds,
        executions.c.lease_token,
        executions.c.outcome,
    )
    .select_from(
        tasks.outerjoin(
            executions,
            and_(
                executions.c.task_id == tasks.c.task_id,
                executions.c.generation == tasks.c.generation,
            ),
        )
    )
    .where(tasks.c.task_id == bindparam("task_id"), tasks.c.generation == bindparam("generation"))
    .with_for_update(of=tasks)
)


def check_fence(conn: Connection, fence: Fence) -> LiveGeneration:
    """Raise `StaleGeneration` unless `fence` names the task's live, running generation."""
    found = driver.fetch(conn, _FENCE, {"task_id": fence.task_id, "generation": fence.generation})
    status, session_id, title, rounds, lease_token, outcome = found[0] if found else (None,) * 6
    if status != "running":
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} is no longer live"
        )
    if outcome is not None or lease_token != fence.lease_token:
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} does not hold the lease"
        )
    return LiveGeneration(session_id=session_id, title=title, rounds=rounds)
