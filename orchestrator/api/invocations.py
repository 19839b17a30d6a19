"""Operators and write receipts: `GET /api/v1/invocations/{invocation_id}`, and
`POST /api/v1/invocations/{invocation_id}/resolve` (an `operator` settles an `unknown` or
`pending` task write; see `services.invocations`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from orchestrator.api.auth import require_role
from orchestrator.api.change_views import ResolvedView
from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_db
from orchestrator.api.human_steps import decider, says_who
from orchestrator.api.models import InvocationView
from orchestrator.errors import NotFound, echoed
from orchestrator.operators import Operator
from orchestrator.runtime import celery_dispatcher
from orchestrator.services.invocations import InvocationService
from orchestrator.services.operator_requests import ResolveBody
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger

__all__ = ["ResolveBody", "ResolvedView", "router"]

router = APIRouter(prefix="/api/v1/invocations", tags=["invocations"])


def get_invocations(request: Request) -> InvocationService:
    """One InvocationService per app (a resolution may queue a generation: a dispatcher)."""
    service: InvocationService | None = getattr(request.app.state, "invocations", None)
    if service is None:
        dispatcher = celery_dispatcher(request.app.state.settings)
        service = InvocationService(request.app.state.db, dispatcher)
        request.app.state.invocations = service
    return service


@router.get("/{invocation_id}", response_model=InvocationView, responses=error_responses(404))
def get_invocation(invocation_id: str, db: Database = Depends(get_db)) -> dict[str, Any]:
    """The latest observed status of one receipt: never its arguments, token or output."""
    receipt = ReceiptLedger(db).get(invocation_id)
    if receipt is None:
        raise NotFound(f"no invocation {echoed(invocation_id)}")
    return receipt.public()


@router.post(
    "/{invocation_id}/resolve",
    response_model=ResolvedView,
    responses=error_responses(401, 403, 404, 409, 422),
)
@says_who
def resolve_invocation(
    invocation_id: str,
    body: ResolveBody,
    service: InvocationService = Depends(get_invocations),
    operator: Operator = Depends(require_role("operator")),
) -> ResolvedView:
    """Settle a task's `unknown` or `pending` write as `succeeded` or `failed` (409
    `not_resolvable` in any other status, `not_task_write` for a receipt of no task)."""
    by = decider(operator, body.by)
    return ResolvedView.of(service.resolve(invocation_id, body.status, by=by, reason=body.reason))
