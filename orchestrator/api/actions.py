"""Operators decide on proposed actions: `/api/v1/actions`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.contract import Page, error_responses, paged
from orchestrator.api.enums import ActionStatus
from orchestrator.api.models import ActionView
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


@router.get("", response_model=Page[ActionView])
def list_actions(
    status: ActionStatus | None = Query(
        default=ActionStatus.pending_approval, description="omit with `any=true` for every status"
    ),
    any_status: bool = Query(default=False, alias="any", description="every status"),
    task_id: str | None = Query(default=None, max_length=36),
    limit: int = Query(default=100, ge=1, le=200),
    cursor: str | None = Query(default=None, max_length=512),
    service: ActionService = Depends(get_action_service),
) -> dict[str, Any]:
    """Newest first; pending approvals unless `status` or `any` asks for others."""
    wanted = None if any_status or status is None else str(status)
    rows = service.list(status=wanted, task_id=task_id, limit=limit + 1, cursor=cursor)
    items, next_cursor = paged(rows, limit, lambda a: (a.created_at, a.action_id))
    return {"items": [action.to_dict() for action in items], "next_cursor": next_cursor}


@router.post("/{action_id}/approve", response_model=ActionView, responses=error_responses(404, 409))
def approve(
    action_id: str, body: Decision, service: ActionService = Depends(get_action_service)
) -> dict[str, Any]:
    return service.decide(action_id, approve=True, by=body.by, note=body.note).to_dict()


@router.post("/{action_id}/reject", response_model=ActionView, responses=error_responses(404, 409))
def reject(
    action_id: str, body: Decision, service: ActionService = Depends(get_action_service)
) -> dict[str, Any]:
    return service.decide(action_id, approve=False, by=body.by, note=body.note).to_dict()
