"""`GET /api/v1/tasks/{task_id}/plan` and `/evidence`: a task's record across its generations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from orchestrator.api.contract import Page, error_responses
from orchestrator.api.deps import get_db
from orchestrator.api.models import EvidenceView
from orchestrator.api.plan_views import TaskPlanView
from orchestrator.services.task_records import TaskRecords
from orchestrator.store.db import Database

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])


@router.get(
    "/{task_id}/plan",
    response_model=TaskPlanView,
    response_model_exclude_unset=True,
    responses=error_responses(404),
)
def task_plan(task_id: str, db: Database = Depends(get_db)) -> dict[str, Any]:
    """The task's current plan, whichever session (generation) holds it."""
    return TaskRecords(db).plan(task_id)


@router.get(
    "/{task_id}/evidence", response_model=Page[EvidenceView], responses=error_responses(404)
)
def task_evidence(task_id: str, db: Database = Depends(get_db)) -> dict[str, Any]:
    """Every evidence record the host wrote for the task, oldest first."""
    return TaskRecords(db).evidence(task_id)
