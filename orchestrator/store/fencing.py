"""Fencing: a write of an execution is applied only while its generation is the live one.

Call `check_fence(conn, fence)` inside the transaction that applies the write; it locks the task
row (Postgres) so a requeue or cancel cannot slip between the check and the write.
"""

from __future__ import annotations

from sqlalchemy import Connection, and_, select

from orchestrator.errors import StaleGeneration
from orchestrator.store.tables import executions, tasks
from orchestrator.tools.base import Fence

__all__ = ["check_fence"]


def check_fence(conn: Connection, fence: Fence) -> None:
    """Raise `StaleGeneration` unless `fence` names the task's live, running generation."""
    row = conn.execute(
        select(tasks.c.status, executions.c.lease_token, executions.c.outcome)
        .select_from(
            tasks.outerjoin(
                executions,
                and_(
                    executions.c.task_id == tasks.c.task_id,
                    executions.c.generation == tasks.c.generation,
                ),
            )
        )
        .where(tasks.c.task_id == fence.task_id, tasks.c.generation == fence.generation)
        .with_for_update(of=tasks)
    ).one_or_none()
    if row is None or row.status != "running":
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} is no longer live"
        )
    if row.outcome is not None or row.lease_token != fence.lease_token:
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} does not hold the lease"
        )
