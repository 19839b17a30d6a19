"""Operators and write receipts: `GET /api/v1/invocations/{invocation_id}`, and
`POST /api/v1/invocations/{invocation_id}/resolve` (an `operator` settles an `unknown` or
`pending` task write; see `services.invocations`)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.auth import require_role
from orchestrator.api.contract import WAKE_UP_DISPATCHED, FilledText, error_responses
from orchestrator.api.deps import get_db
from orchestrator.api.enums import ReceiptStatus, TaskStatus
from orchestrator.api.human_steps import decider, says_who
from orchestrator.api.models import InvocationView
from orchestrator.errors import NotFound, echoed
from orchestrator.operators import Operator
from orchestrator.runtime import celery_dispatcher
from orchestrator.services.invocations import REASON_MAX, InvocationService, Resolution
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


class ResolveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["succeeded", "failed"] = Field(description="what really happened")
    reason: FilledText = Field(
        min_length=1, max_length=REASON_MAX, description="how the operator knows"
    )
    by: FilledText | None = Field(
        default=None, min_length=1, max_length=128, description="who resolves it"
    )


class ResolvedView(BaseModel):
    invocation_id: str
    tool_name: str
    status: ReceiptStatus = Field(description="the receipt's status now")
    previous_status: ReceiptStatus
    summary: str
    resolved_by: str
    reason: str
    task_id: str
    task_status: TaskStatus = Field(description="the task's status after the resolution")
    generation: int
    queued_generation: int | None = Field(
        description="the generation queued at once when the task waited only on open writes"
    )
    dispatched: bool | None = Field(default=None, description=WAKE_UP_DISPATCHED)

    @classmethod
    def of(cls, resolution: Resolution) -> ResolvedView:
        receipt = resolution.receipt
        return cls(
            invocation_id=receipt.invocation_id,
            tool_name=receipt.tool_name,
            status=ReceiptStatus(receipt.status),
            previous_status=ReceiptStatus(resolution.previous_status),
            summary=receipt.summary,
            resolved_by=resolution.by,
            reason=resolution.reason,
            task_id=resolution.task_id,
            task_status=TaskStatus(resolution.task_status),
            generation=resolution.generation,
            queued_generation=resolution.queued_generation,
            dispatched=None if resolution.wake_up is None else resolution.wake_up.sent,
        )


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
