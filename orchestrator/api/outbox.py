"""Deliveries to the business backend over HTTP: `/api/v1/outbox` (list, or one by its id; an
operator retries a dead letter or hurries a failing one, or discards one dealt with by hand,
dead or failing, saying why)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field

from orchestrator.api.auth import require_role
from orchestrator.api.contract import error_responses
from orchestrator.api.delivery_views import Delivery, DeliveryKind, DeliveryStatus
from orchestrator.api.etags import IF_NONE_MATCH, NOT_MODIFIED, shape_of, tagged
from orchestrator.api.human_steps import decider, says_who
from orchestrator.operators import Operator
from orchestrator.services.operator_requests import DiscardBody, RetryBody
from orchestrator.services.outbox_operations import MAX_OUTBOX_ID, OutboxService

__all__ = [
    "ERROR_RESPONSES",
    "Delivery",
    "DeliveryKind",
    "DeliveryStatus",
    "DiscardBody",
    "ListedDelivery",
    "RetryBody",
    "router",
]

router = APIRouter(prefix="/api/v1/outbox", tags=["outbox"])


#: The error answers the outbox routes declare (the shared envelope).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = error_responses(404, 409)


class ListedDelivery(Delivery):
    """A delivery as the list shows it: a pending webhook held back in order says by what (the
    console's deliveries view says the same)."""

    waits_behind: int | None = Field(
        default=None,
        description="a pending webhook held back by an earlier event of its task that is "
        "dead-lettered: that row's outbox id (it is sent once that one is retried or "
        "discarded; not a stuck dispatcher)",
    )
    waits_behind_retried: int | None = Field(
        default=None,
        description="a pending webhook held back in order by an earlier event of its task "
        "that failed and is being retried (pending and tried, not dead yet): that row's outbox "
        "id (it is sent once that one is delivered; not a stuck dispatcher)",
    )


class RetryDeadBody(RetryBody):
    kind: DeliveryKind | None = Field(default=None, description="only deliveries of this kind")
    task_id: str | None = Field(
        default=None, min_length=1, max_length=36, description="only this task's deliveries"
    )


class RetriedDead(BaseModel):
    retried: int = Field(description="how many dead-lettered deliveries are due again")


class RetriedFailing(BaseModel):
    retried: int = Field(description="how many failing deliveries are due now")
    being_sent: int = Field(
        description="failing deliveries a dispatcher was sending: left to it (retry them once "
        "their answer is recorded, if they failed again)"
    )


class DeliveryPage(BaseModel):
    items: list[ListedDelivery]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


def get_outbox(request: Request) -> OutboxService:
    return OutboxService(request.app.state.db)


def _retrier(operator: Operator, body: RetryBody) -> str:
    """Who retries: an account's name, or the shared token's `by`. Not required of the shared
    token (a retry took no body before, and the console sends none): then its account, `api`."""
    if operator.shared and body.by is not None:
        return body.by
    return operator.name


#: Part of every tag of a page of deliveries: a client holding an older API's page gets the new.
_LIST_SHAPE = shape_of(DeliveryPage)


@router.get("", response_model=DeliveryPage, responses={**NOT_MODIFIED, **ERROR_RESPONSES})
def list_deliveries(
    response: Response,
    task_id: str | None = Query(default=None, max_length=36),
    status: DeliveryStatus | None = Query(default=None),
    kind: DeliveryKind | None = Query(default=None),
    cursor: int | None = Query(default=None, ge=0, le=MAX_OUTBOX_ID),
    limit: int = Query(default=50, ge=1, le=200),
    if_none_match: str | None = IF_NONE_MATCH,
    service: OutboxService = Depends(get_outbox),
) -> Any:
    """Deliveries oldest first; `status=dead` lists what an operator may retry, and a pending
    webhook held back in order names what it waits behind (`waits_behind`, its task's dead
    letter; `waits_behind_retried`, an earlier event being retried). A `task_id` that
    names no task is a 404, not an empty page. With the page's `ETag` in `If-None-Match`,
    `304` and no body while the page is unchanged (the console's deliveries view polls it)."""
    # One row more than the page: a cursor only when another page has rows.
    rows = service.listed(
        task_id=task_id, status=status, kind=kind, after_id=cursor, limit=limit + 1
    )
    page = rows[:limit]
    next_cursor = str(page[-1]["outbox_id"]) if len(rows) > limit else None
    # The page as read, each row with what it waits behind (another row of its task, dead or
    # retried, changes it too): an attempt, a dead letter, a retry, a discard or a new event
    # on the page changes the tag, and the tag cannot name another page.
    unchanged = tagged(response, if_none_match, _LIST_SHAPE, (next_cursor, page))
    if unchanged is not None:
        return unchanged
    return {"items": page, "next_cursor": next_cursor}


@router.get("/{outbox_id}", response_model=ListedDelivery, responses=ERROR_RESPONSES)
def show_delivery(
    outbox_id: int = Path(ge=1, le=MAX_OUTBOX_ID), service: OutboxService = Depends(get_outbox)
) -> dict[str, Any]:
    """One delivery's whole state, as the list shows it (`X-Orchestrator-Delivery`, a log
    line or an alert names its id): status, attempts, last error, next attempt, why it is dead,
    what it waits behind, who discarded it and why. An id that names no row is a 404."""
    return service.shown(outbox_id)


@router.post("/retry-dead", response_model=RetriedDead, responses=ERROR_RESPONSES)
def retry_every_dead(
    body: RetryDeadBody | None = None,
    service: OutboxService = Depends(get_outbox),
    operator: Operator = Depends(require_role("operator")),
) -> dict[str, int]:
    """Every dead-lettered delivery (of `kind`, of `task_id`) due again now, with fresh counts:
    once the backend, or a secret rotated on one side, is mended (`outbox retry --all-dead`).
    A `task_id` that names no task is a 404, not `{"retried": 0}`."""
    body = body or RetryDeadBody()
    by = _retrier(operator, body)
    return {
        "retried": service.retry_all(kind=body.kind, task_id=body.task_id, by=by, note=body.note)
    }


@router.post("/retry-failing", response_model=RetriedFailing, responses=ERROR_RESPONSES)
def retry_every_failing(
    body: RetryDeadBody | None = None,
    service: OutboxService = Depends(get_outbox),
    operator: Operator = Depends(require_role("operator")),
) -> dict[str, int]:
    """Every pending delivery (of `kind`, of `task_id`) that failed and waits out its backoff,
    due now with its counts kept: once the backend is mended after an outage (`outbox retry
    --all-failing`). One a dispatcher is sending is left to it, and counted in `being_sent`.
    A `task_id` that names no task is a 404."""
    body = body or RetryDeadBody()
    retried, being_sent = service.retry_failing(
        kind=body.kind, task_id=body.task_id, by=_retrier(operator, body), note=body.note
    )
    return {"retried": retried, "being_sent": being_sent}


@router.post("/{outbox_id}/retry", response_model=Delivery, responses=ERROR_RESPONSES)
def retry_delivery(
    body: RetryBody | None = None,
    outbox_id: int = Path(ge=1, le=MAX_OUTBOX_ID),
    service: OutboxService = Depends(get_outbox),
    operator: Operator = Depends(require_role("operator")),
) -> dict[str, Any]:
    """A dead-lettered delivery is due again now, with fresh attempt and throttled counts; a
    pending one (failing, backing off) is due now, its counts kept, once the backend is mended.
    `409 being_sent` while a dispatcher is sending it or holds it in its batch, about to post
    it (retry once its answer is recorded),
    `409 waits_behind` when it waits in order behind an earlier event of its task (retry that
    one), `409 invalid_transition` for a delivered or discarded one. The row records who
    retried it, when, and the body's `note` (`retried_by`, `retried_at`, `retry_note`)."""
    body = body or RetryBody()
    return service.retry(outbox_id, by=_retrier(operator, body), note=body.note).public()


@router.post("/{outbox_id}/discard", response_model=Delivery, responses=ERROR_RESPONSES)
@says_who
def discard_delivery(
    body: DiscardBody,
    outbox_id: int = Path(ge=1, le=MAX_OUTBOX_ID),
    service: OutboxService = Depends(get_outbox),
    operator: Operator = Depends(require_role("operator")),
) -> dict[str, Any]:
    """Settle a delivery an operator dealt with by hand, dead-lettered or pending (an action
    the backend answers 500 for every time is retried for ever otherwise): never sent again,
    and its task's later events go on; the row keeps who, when and why. One claimed in a
    dispatcher's batch and waiting its turn (`sending_since` null) is discarded too: the
    dispatcher re-checks it as its turn comes and does not post it. `409 being_sent` once a
    dispatcher has posted it (its answer may deliver it), `409 invalid_transition` for a
    delivered or discarded one."""
    by = decider(operator, body.by)
    return service.discard(outbox_id, reason=body.reason, by=by).public()
