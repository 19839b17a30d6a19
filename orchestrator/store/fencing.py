"""Fencing: a write of an execution is applied only while its generation is the live one.

Call `check_fence(conn, fence)` inside the transaction that applies the write; it locks the task
row (Postgres) so a requeue or cancel cannot slip between the check and the write.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from orchestrator.errors import StaleGeneration
from orchestrator.store.tables import executions, tasks
from orchestrator.tools.base import Fence

__all__ = ["check_fence"]


def check_fence(conn: Connection, fence: Fence) -> None:
    """Raise `StaleGeneration` unless `fence` names the task's live, running generation."""
    task_row = conn.execute(
        select(tasks.c.generation, tasks.c.status)
        .where(tasks.c.task_id == fence.task_id)
        .with_for_update()
    ).one_or_none()
    if task_row is None or task_row.generation != fence.generation or task_row.status != "running":
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} is no longer live"
        )
    execution = conn.execute(
        select(executions.c.lease_token, executions.c.outcome).where(
            executions.c.task_id == fence.task_id, executions.c.generation == fence.generation
        )
    ).one_or_none()
    if (
        execution is None
        or execution.outcome is not None
        or execution.lease_token != fence.lease_token
    ):
        raise StaleGeneration(
            f"generation {fence.generation} of task {fence.task_id} does not hold the lease"
        )
