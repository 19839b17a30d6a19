"""What a task has on record whichever session or generation wrote it: its current plan and the
evidence the host recorded for it (operators, the console, collaboration answers)."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import NotFound, echoed
from orchestrator.store import evidence as evidence_store
from orchestrator.store import task_plans
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database

__all__ = ["TaskRecords"]


class TaskRecords:
    def __init__(self, db: Database) -> None:
        self.db = db

    def plan(self, task_id: str) -> dict[str, Any]:
        """`{"task_id", "plan"}`: the task's latest revision (None before its first plan)."""
        with self.db.transaction(readonly=True) as conn:
            if task_store.get_task(conn, task_id) is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            plan = task_plans.task_latest_plan(conn, task_id)
        return {"task_id": task_id, "plan": plan.to_dict() if plan else None}

    def evidence(self, task_id: str) -> dict[str, Any]:
        """`{"items", "next_cursor"}`: every evidence record of the task, oldest first."""
        with self.db.transaction(readonly=True) as conn:
            if task_store.get_task(conn, task_id) is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            items = evidence_store.evidence_of_task(conn, task_id)
        return {"items": items, "next_cursor": None}
