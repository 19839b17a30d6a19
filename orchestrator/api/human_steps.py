"""A person closes a human node: `POST /api/v1/tasks/{task_id}/nodes/{node_id}/complete|fail|skip`.

With operator accounts the step's `by` is the authenticated name; with the shared token (or
none) the body says who. Viewers cannot write (the auth middleware refuses them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request

from orchestrator.api.auth import require_role
from orchestrator.api.change_views import HumanStepOut
from orchestrator.api.contract import error_responses
from orchestrator.errors import ValidationFailed
from orchestrator.operators import Operator
from orchestrator.runtime import celery_dispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.operator_requests import CloseBody, CompleteBody
from orchestrator.services.plans import PlanService

__all__ = ["HumanStepOut", "decider", "missing_by", "router", "says_who"]

router = APIRouter(prefix="/api/v1/tasks", tags=["human steps"])


def get_human_steps(request: Request) -> HumanStepService:
    service: HumanStepService | None = getattr(request.app.state, "human_steps", None)
    if service is None:
        plans: PlanService = request.app.state.plans
        dispatcher = celery_dispatcher(request.app.state.settings)
        service = HumanStepService(request.app.state.db, plans, dispatcher)
        request.app.state.human_steps = service
    return service


def decider(operator: Operator, by: str | None) -> str:
    """Who acts: the authenticated account's name, or the body's `by` for the shared token."""
    if not operator.shared:
        return operator.name
    if by is None:
        raise ValidationFailed(
            "`by` is required: say who acts",
            code="invalid_request",
            details=[{"code": "invalid_request", "message": "by is required", "field": "by"}],
        )
    return by


_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])
#: The routes whose body says who acts under the shared token (`decider`).
_SAYS_WHO: set[Callable[..., Any]] = set()


def says_who(endpoint: _Endpoint) -> _Endpoint:
    """Mark a route that calls `decider` on its body's `by`: a body refused for other fields
    names a missing `by` too (`missing_by`)."""
    _SAYS_WHO.add(endpoint)
    return endpoint


def missing_by(request: Request, body: Any) -> dict[str, str] | None:
    """The detail for a missing `by` in a body refused for other fields, else None.

    The body is validated before the route runs `decider`, so a body short of its evidence
    (or reason) and of its `by` was refused for the one, and for `by` on the next call.
    """
    operator = getattr(request.state, "operator", None)
    route = request.scope.get("route")
    if not isinstance(operator, Operator) or not operator.shared:
        return None
    if getattr(route, "endpoint", None) not in _SAYS_WHO:
        return None
    if not isinstance(body, dict) or body.get("by") is not None:
        return None
    return {"code": "invalid_request", "message": "by is required", "field": "body.by"}


_ERRORS: dict[int | str, dict[str, Any]] = error_responses(401, 403, 404, 409, 422)
_OPERATOR = require_role("operator")


@router.post("/{task_id}/nodes/{node_id}/complete", response_model=HumanStepOut, responses=_ERRORS)
@says_who
def complete_node(
    task_id: str,
    node_id: str,
    body: CompleteBody,
    service: HumanStepService = Depends(get_human_steps),
    operator: Operator = Depends(_OPERATOR),
) -> HumanStepOut:
    """Complete a human node (sampling, re-test, follow-up call) with its evidence."""
    by = decider(operator, body.by)
    return HumanStepOut.of(
        service.close(task_id, node_id, "completed", by=by, evidence=body.evidence)
    )


@router.post("/{task_id}/nodes/{node_id}/fail", response_model=HumanStepOut, responses=_ERRORS)
@says_who
def fail_node(
    task_id: str,
    node_id: str,
    body: CloseBody,
    service: HumanStepService = Depends(get_human_steps),
    operator: Operator = Depends(_OPERATOR),
) -> HumanStepOut:
    by = decider(operator, body.by)
    return HumanStepOut.of(service.close(task_id, node_id, "failed", by=by, reason=body.reason))


@router.post("/{task_id}/nodes/{node_id}/skip", response_model=HumanStepOut, responses=_ERRORS)
@says_who
def skip_node(
    task_id: str,
    node_id: str,
    body: CloseBody,
    service: HumanStepService = Depends(get_human_steps),
    operator: Operator = Depends(_OPERATOR),
) -> HumanStepOut:
    by = decider(operator, body.by)
    return HumanStepOut.of(service.close(task_id, node_id, "skipped", by=by, reason=body.reason))
