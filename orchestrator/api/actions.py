"""Operators decide on proposed actions: `/api/v1/actions`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.services.actions import ActionService
from orchestrator.services.plans import PlanService

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/actions", tags=["actions"])


def get_action_service(request: Request) -> ActionService:
    plans: PlanService = request.app.state.plans
    return ActionService(request.app.state.db, plans)


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str = Field(min_length=1, max_length=128, description="who decides")
    note: str | None = Field(default=None, max_length=2000)


@router.get("")
def list_actions(
    status: str | None = Query(default="pending_approval"),
    task_id: str | None = Query(default=None, max_length=36),
    limit: int = Query(default=100, ge=1, le=200),
    service: ActionService = Depends(get_action_service),
) -> dict[str, Any]:
    found = service.list(status=status or None, task_id=task_id, limit=limit)
    return {"actions": [action.to_dict() for action in found]}


@router.post("/{action_id}/approve")
def approve(
    action_id: str, body: Decision, service: ActionService = Depends(get_action_service)
) -> dict[str, Any]:
    return service.decide(action_id, approve=True, by=body.by, note=body.note).to_dict()


@router.post("/{action_id}/reject")
def reject(
    action_id: str, body: Decision, service: ActionService = Depends(get_action_service)
) -> dict[str, Any]:
    return service.decide(action_id, approve=False, by=body.by, note=body.note).to_dict()
