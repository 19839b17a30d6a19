"""Execution plans: the public readers and the internal bridge's publish.

A session's plans are read as the session is (`sessions.readable_session`): a task's execution
session by anyone who reads, a chat or a collaboration by its owner (or the shared token).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Path, Response

from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_plans
from orchestrator.api.plan_views import PlanHistoryView, PlanRevisionView
from orchestrator.api.sessions import readable_session
from orchestrator.domain.fences import Fence
from orchestrator.domain.storable import storable_text
from orchestrator.errors import ValidationFailed
from orchestrator.services.plans import PlanService

__all__ = ["internal_router", "router"]

router = APIRouter(prefix="/api/v1/sessions", tags=["plans"])
_BRIDGE_ERRORS = error_responses(401, 404, 409, 413, 422)
internal_router = APIRouter(prefix="/sessions", tags=["internal"])


@router.get(
    "/{session_id}/execution-plans",
    response_model=PlanHistoryView,
    response_model_exclude_unset=True,
    responses=error_responses(403, 404),
    dependencies=[Depends(readable_session)],
)
def plan_history(session_id: str, plans: PlanService = Depends(get_plans)) -> dict[str, Any]:
    """The latest revision in full and a summary of every revision, oldest first."""
    return plans.history(session_id)


@router.get(
    "/{session_id}/execution-plans/{revision}",
    response_model=PlanRevisionView,
    response_model_exclude_unset=True,
    responses=error_responses(403, 404),
    dependencies=[Depends(readable_session)],
)
def plan_revision(
    session_id: str,
    revision: int = Path(ge=1, le=2**31 - 1),
    plans: PlanService = Depends(get_plans),
) -> dict[str, Any]:
    """One revision as stored; unknown session or revision is a 404."""
    return plans.revision(session_id, revision).to_dict()


#: The store's generation column is a 32-bit integer: a larger one is no generation of a task.
_MAX_GENERATION = 2**31 - 1


def _storable(value: Any) -> bool:
    try:
        return isinstance(value, str) and storable_text(value) == value
    except ValueError:
        return False


def _fence(raw: Any) -> Fence:
    """The optional `fence` of a bridge publish: an execution proves it is the live generation."""
    if (
        isinstance(raw, dict)
        and set(raw) == {"task_id", "generation", "lease_token"}
        and _storable(raw["task_id"])
        and isinstance(raw["generation"], int)
        and not isinstance(raw["generation"], bool)
        and 1 <= raw["generation"] <= _MAX_GENERATION
        and _storable(raw["lease_token"])
    ):
        return Fence(raw["task_id"], raw["generation"], raw["lease_token"])
    message = (
        "fence must be {task_id: string, generation: integer 1.."
        f"{_MAX_GENERATION}, lease_token: string}}, its strings without NUL"
    )
    raise ValidationFailed(
        message,
        code="invalid_type",
        details=[{"code": "invalid_type", "message": message, "field": "fence"}],
    )


@internal_router.post(
    "/{session_id}/execution-plans",
    status_code=201,
    response_model=PlanRevisionView,
    response_model_exclude_unset=True,
    responses={
        200: {"model": PlanRevisionView, "description": "the same plan again: replayed"},
        **_BRIDGE_ERRORS,
    },
)
def publish_plan(
    session_id: str,
    response: Response,
    payload: dict[str, Any] = Body(),
    plans: PlanService = Depends(get_plans),
) -> dict[str, Any]:
    """publish_execution_plan for an agent outside the worker: 201 new, 200 replayed."""
    body = dict(payload)
    fence = _fence(body.pop("fence")) if "fence" in body else None
    result = plans.publish_execution_plan(session_id, body, fence=fence)
    if not result.created:
        response.status_code = 200
    return result.to_dict()


@internal_router.get(
    "/{session_id}/execution-plans",
    response_model=PlanHistoryView,
    response_model_exclude_unset=True,
    responses=_BRIDGE_ERRORS,
)
def internal_plan_history(
    session_id: str, plans: PlanService = Depends(get_plans)
) -> dict[str, Any]:
    """The same view as the public reader, for an agent that must keep every node."""
    return plans.history(session_id)
