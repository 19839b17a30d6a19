"""Operators decide on proposed actions: `/api/v1/actions`.

An approval names the digest of the action (shown by `GET /api/v1/actions/{id}`); only an
`approver` account decides, and with operator accounts its name is the decision's `by`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field, field_validator

from orchestrator.api.auth import require_role
from orchestrator.api.contract import (
    WAKE_UP_DISPATCHED,
    IsoTime,
    Page,
    error_responses,
    paged,
)
from orchestrator.api.delivery_views import Delivery
from orchestrator.api.enums import ActionStatus
from orchestrator.api.etags import IF_NONE_MATCH, NOT_MODIFIED, shape_of, tagged
from orchestrator.api.explain_views import PAYLOAD_DESCRIPTION, payload_as_sent
from orchestrator.api.human_steps import decider, says_who
from orchestrator.errors import ValidationFailed
from orchestrator.operators import Operator
from orchestrator.runtime import celery_dispatcher
from orchestrator.services.actions import ActionService, Decided
from orchestrator.services.operator_requests import Decision
from orchestrator.services.plans import PlanService
from orchestrator.store.action_context import ActionContext
from orchestrator.store.actions import ActionRecord

__all__ = ["ActionOut", "DecidedView", "PendingCount", "router"]

router = APIRouter(prefix="/api/v1/actions", tags=["actions"])


def get_action_service(request: Request) -> ActionService:
    """One ActionService per app, built on first use (a decision wakes the next generation)."""
    service: ActionService | None = getattr(request.app.state, "actions", None)
    if service is None:
        plans: PlanService = request.app.state.plans
        dispatcher = celery_dispatcher(request.app.state.settings)
        service = ActionService(request.app.state.db, plans, dispatcher)
        request.app.state.actions = service
    return service


class ActionOut(BaseModel):
    """An action as operators see it: what it would do, what it is bound to, who decided."""

    action_id: str
    task_id: str
    generation: int
    session_id: str
    node_id: str
    kind: str
    payload: dict[str, Any] | str = Field(description=PAYLOAD_DESCRIPTION)
    status: str
    digest: str = Field(description="SHA-256 of the canonical {kind, payload}: approve names it")
    plan_revision: int | None = Field(description="the plan revision it was proposed under")
    decided_by: str | None
    decided_at: IsoTime | None
    note: str | None
    created_at: IsoTime

    @field_validator("payload", mode="before")
    @classmethod
    def _older_payload_as_text(cls, payload: Any) -> Any:
        return payload_as_sent(payload)

    @classmethod
    def of(cls, record: ActionRecord) -> ActionOut:
        return cls(**record.to_dict())


class ActionNode(BaseModel):
    """The node an action serves, as the plan revision it was proposed under drew it."""

    title: str | None
    status: str | None
    reason: str | None = Field(description="why the node stood as it did (it waits for this)")
    description: str | None


class ActionShown(ActionOut):
    """One action, with where its delivery to the business backend stands and what an
    approver reads beside it: the task's title and the node it serves."""

    task_title: str | None = Field(default=None, description="the title of the task it acts for")
    node: ActionNode | None = Field(
        default=None,
        description="its node in the plan revision it was proposed under (null when that "
        "revision or node is not stored)",
    )

    delivery: Delivery | None = Field(
        default=None,
        description="its outbox row once approved (null before, and for a rejected action): "
        "`pending` (with `attempts`, `last_error`, `next_attempt_at`), `delivered` "
        "(`delivered_at`), `dead` (retry or discard it: `POST /api/v1/outbox/{id}/retry`, "
        "`/discard`) or `discarded` (`discarded_by`, `discarded_at`, `discard_reason`): never "
        "read as delivered unless `delivered`",
    )


class DecidedView(ActionOut):
    """An action as decided, and whether the generation the decision queued was woken."""

    queued_generation: int | None = Field(
        default=None, description="the generation the decision queued, when it queued one"
    )
    dispatched: bool | None = Field(default=None, description=WAKE_UP_DISPATCHED)

    @classmethod
    def decided(cls, decided: Decided) -> DecidedView:
        wake_up = decided.wake_up
        return cls(
            **decided.action.to_dict(),
            queued_generation=None if wake_up is None else wake_up.generation,
            dispatched=None if wake_up is None else wake_up.sent,
        )


#: Part of every tag of a page of actions: a client holding an older API's page gets the new one.
_LIST_SHAPE = shape_of(Page[ActionShown])


@router.get(
    "", response_model=Page[ActionShown], responses={**NOT_MODIFIED, **error_responses(404)}
)
def list_actions(
    request: Request,
    response: Response,
    status: ActionStatus | None = Query(
        default=ActionStatus.pending_approval, description="omit with `any=true` for every status"
    ),
    any_status: bool = Query(default=False, alias="any", description="every status"),
    decided: bool = Query(
        default=False,
        description="every status but `pending_approval` (approved, rejected, superseded): a "
        "task's decided actions, page after page; not with `status` or `any`",
    ),
    task_id: str | None = Query(default=None, max_length=36),
    limit: int = Query(default=100, ge=1, le=200),
    cursor: str | None = Query(
        default=None,
        max_length=512,
        description="`next_cursor` of the previous page, asked with the same filters and order",
    ),
    order: Literal["newest", "oldest"] = Query(
        default="newest",
        description="`oldest` lists the longest waiting first, as an approver decides them",
    ),
    if_none_match: str | None = IF_NONE_MATCH,
    service: ActionService = Depends(get_action_service),
) -> Any:
    """Newest first (or oldest, with `order=oldest`); pending approvals unless `status`, `any`
    or `decided` asks for others. Each with its `delivery`, as one action shows it: approved
    work orders the backend never took are found in the list. A `task_id` that names no task is
    a 404, not an empty page. With the page's `ETag` in `If-None-Match`, `304` and no body
    while the page is unchanged (the console's task page reads its pending and its decided
    actions when the task's view changed)."""
    if decided and (any_status or "status" in request.query_params):
        _refuse_decided_with_status()
    wanted = None if any_status or decided or status is None else str(status)
    rows = service.listed(
        status=wanted,
        task_id=task_id,
        limit=limit + 1,
        cursor=cursor,
        oldest_first=order == "oldest",
        decided=decided,
    )
    items, next_cursor = paged(
        rows, limit, lambda r: (r[0].created_at, r[0].action_id), oldest_first=order == "oldest"
    )
    # The records the page is built from, as read (each action with its delivery row: a
    # decision, or a delivery attempt, changes the tag): the tag cannot name another page.
    unchanged = tagged(response, if_none_match, _LIST_SHAPE, (next_cursor, items))
    if unchanged is not None:
        return unchanged
    contexts = service.contexts([action for action, _ in items])
    return {
        "items": [
            {**action.to_dict(), "delivery": delivery, **_context(contexts, action.action_id)}
            for action, delivery in items
        ],
        "next_cursor": next_cursor,
    }


def _context(contexts: dict[str, ActionContext], action_id: str) -> dict[str, Any]:
    context = contexts.get(action_id)
    return {} if context is None else {"task_title": context.task_title, "node": context.node}


def _refuse_decided_with_status() -> None:
    """`decided=true` is a status filter of its own: with `status` or `any` beside it, one of
    them would be ignored (`status=approved&decided=true` listing the rejected ones too)."""
    message = "`decided=true` lists every decided status: ask it without `status` or `any`"
    detail = {"code": "invalid_request", "message": message, "field": "decided"}
    raise ValidationFailed(message, code="invalid_request", details=[detail])


class PendingCount(BaseModel):
    pending: int = Field(description="actions waiting for a decision")


_COUNT_SHAPE = shape_of(PendingCount)


# Before `/{action_id}`, which would take `pending-count` for an id.
@router.get(
    "/pending-count",
    response_model=PendingCount,
    responses={**NOT_MODIFIED, **error_responses(404)},
)
def count_pending(
    response: Response,
    task_id: str | None = Query(default=None, max_length=36),
    if_none_match: str | None = IF_NONE_MATCH,
    service: ActionService = Depends(get_action_service),
) -> Any:
    """How many actions wait for a decision (of one task), without fetching them: a page that
    shows the oldest few says how many there are in all. Pending only: the decided ones are
    history, and counting them would read all of it. A `task_id` that names no task is a 404,
    not 0 (a mistyped id read as "nothing waits"). With its `ETag` in `If-None-Match`,
    `304` and no body while the count is the same (the console's approvals page polls it with
    the oldest pending actions every 6 s)."""
    pending = service.count_pending(task_id)
    unchanged = tagged(response, if_none_match, _COUNT_SHAPE, (task_id, pending))
    if unchanged is not None:
        return unchanged
    return {"pending": pending}


@router.get("/{action_id}", response_model=ActionShown, responses=error_responses(404))
def show_action(
    action_id: str, service: ActionService = Depends(get_action_service)
) -> ActionShown:
    """One action, with its delivery: an approver sees whether the backend has it."""
    action, delivery = service.shown(action_id)
    context = _context(service.contexts([action]), action_id)
    return ActionShown(**ActionOut.of(action).model_dump(), delivery=delivery, **context)


_DECISION_ERRORS = error_responses(403, 404, 409)

#: Said for an approval without its digest, alone or with the other fields it lacks.
_NO_DIGEST = "an approval names the digest of the action it approves (see `actions show`)"


def _refuse_incomplete_approval(operator: Operator, body: Decision) -> None:
    """Every required field an approval lacks, named in one refusal.

    `by` (for the shared token) and the digest were checked one after the other, so a body
    short of both was refused twice, a field at a time. The digest comes first: it gives the
    refusal its code, `digest_required`, as when it alone is missing.
    """
    if body.digest is not None:
        return  # `decider` refuses a missing `by` alone, as for a rejection
    missing = [{"code": "digest_required", "message": _NO_DIGEST, "field": "digest"}]
    message = _NO_DIGEST
    if operator.shared and body.by is None:
        missing.append({"code": "invalid_request", "message": "by is required", "field": "by"})
        message = (
            "`digest` and `by` are required: name the digest of the action you approve "
            "(see `actions show`) and say who decides"
        )
    raise ValidationFailed(message, code="digest_required", details=missing)


@router.post("/{action_id}/approve", response_model=DecidedView, responses=_DECISION_ERRORS)
@says_who
def approve(
    action_id: str,
    body: Decision,
    service: ActionService = Depends(get_action_service),
    operator: Operator = Depends(require_role("approver")),
) -> DecidedView:
    _refuse_incomplete_approval(operator, body)
    by = decider(operator, body.by)
    return DecidedView.decided(
        service.decide_and_wake(action_id, approve=True, by=by, note=body.note, digest=body.digest)
    )


@router.post("/{action_id}/reject", response_model=DecidedView, responses=_DECISION_ERRORS)
@says_who
def reject(
    action_id: str,
    body: Decision,
    service: ActionService = Depends(get_action_service),
    operator: Operator = Depends(require_role("approver")),
) -> DecidedView:
    by = decider(operator, body.by)
    return DecidedView.decided(
        service.decide_and_wake(action_id, approve=False, by=by, note=body.note, digest=body.digest)
    )
