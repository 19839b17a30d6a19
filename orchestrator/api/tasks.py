"""Triggers and operator commands over HTTP: `/api/v1/tasks`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from orchestrator.api.auth import current_operator
from orchestrator.api.contract import Page, error_responses
from orchestrator.api.enums import TaskStatus
from orchestrator.api.etags import IF_NONE_MATCH, NOT_MODIFIED, shape_of, tagged
from orchestrator.api.models import (
    ExplainView,
    RequeuedView,
    TaskRowView,
    TaskView,
    TranscriptPage,
    TriggerView,
)
from orchestrator.domain.task_filter import TASK_TYPE_MAX, TASK_TYPE_PATTERN, task_filter
from orchestrator.leases import make_lease_backend
from orchestrator.runtime import celery_dispatcher
from orchestrator.services.task_requests import CancelBody, RequeueBody
from orchestrator.services.task_views import task_view
from orchestrator.services.tasks import TaskService, Trigger

__all__ = ["get_task_service", "router"]

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])


def get_task_service(request: Request) -> TaskService:
    """One TaskService per app, built on first use (the dispatcher needs the broker settings)."""
    service: TaskService | None = getattr(request.app.state, "tasks", None)
    if service is None:
        settings = request.app.state.settings
        db = request.app.state.db
        service = TaskService(
            db, celery_dispatcher(settings), make_lease_backend(settings, db), receipts=True
        )
        request.app.state.tasks = service
    return service


#: A trigger id reused with another body is refused (409); the trigger itself is 201 or 200.
_TRIGGER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": TriggerView, "description": "the trigger_id named an existing task"},
    **error_responses(403, 409),
}


@router.post("", status_code=201, response_model=TriggerView, responses=_TRIGGER_RESPONSES)
def trigger_task(
    body: Trigger, response: Response, service: TaskService = Depends(get_task_service)
) -> dict[str, Any]:
    """Create and queue a task; the same `trigger_id` again answers 200 with the same task, and
    409 `trigger_conflict` when its task type, title or context differ."""
    result = service.trigger(body)
    if not result.created:
        response.status_code = 200
    return task_view(result.task) | {"created": result.created, "dispatched": result.dispatched}


#: Part of every tag of a page of the list: a client holding an older API's page gets the new one.
_LIST_SHAPE = shape_of(Page[TaskRowView])


@router.get("", response_model=Page[TaskRowView], responses=NOT_MODIFIED)
def list_tasks(
    response: Response,
    status: TaskStatus | None = Query(default=None),
    task_type: str | None = Query(
        default=None,
        min_length=1,
        max_length=TASK_TYPE_MAX,
        pattern=TASK_TYPE_PATTERN,
        description="only tasks of this type (exact match)",
    ),
    created_after: datetime | None = Query(
        default=None,
        description="only tasks created at or after this ISO-8601 time (no zone: UTC)",
    ),
    created_before: datetime | None = Query(
        default=None,
        description="only tasks created before this ISO-8601 time (no zone: UTC); "
        "must be later than `created_after`",
    ),
    limit: int = Query(default=50, ge=1, le=200),
    cursor: str | None = Query(
        default=None,
        max_length=512,
        description="`next_cursor` of the previous page, asked with the same filters",
    ),
    if_none_match: str | None = IF_NONE_MATCH,
    service: TaskService = Depends(get_task_service),
) -> Any:
    """Newest first, without contexts; follow `next_cursor` for older tasks. The filters
    combine (all must hold); an invalid value is a 422 with the error envelope. With the page's
    `ETag` in `If-None-Match`, `304` and no body while the page is unchanged."""
    where = task_filter(
        status=str(status) if status else None,
        task_type=task_type,
        created_after=created_after,
        created_before=created_before,
    )
    items, next_cursor = service.page_tasks(where=where, limit=limit, cursor=cursor)
    waits = service.handed_back(items)
    # The records the page is built from, as read: the tag cannot name another page.
    unchanged = tagged(
        response, if_none_match, _LIST_SHAPE, (next_cursor, items, sorted(waits.items()))
    )
    if unchanged is not None:
        return unchanged
    return {"items": service.views(items, waits), "next_cursor": next_cursor}


#: Part of every tag of a task's view: a client holding an older API's view gets the new one.
_EXPLAIN_SHAPE = shape_of(ExplainView)


@router.get(
    "/{task_id}",
    response_model=ExplainView,
    # A key a stored record lacks stays absent (a plan node's `action_id`), as it always was.
    response_model_exclude_unset=True,
    responses={**NOT_MODIFIED, **error_responses(404)},
)
def show_task(
    task_id: str,
    response: Response,
    if_none_match: str | None = IF_NONE_MATCH,
    service: TaskService = Depends(get_task_service),
) -> Any:
    """Generations, lease, plan, report, pending approvals and the last fenced write. With the
    `ETag` of the view it holds in `If-None-Match`, a client gets `304` and no body while the
    task is unchanged (read in one statement; the view is built only when it changed)."""
    version = service.view_version(task_id)
    if version is not None:
        unchanged = tagged(response, if_none_match, _EXPLAIN_SHAPE, version)
        if unchanged is not None:
            return unchanged
    return service.explain(task_id)  # no such task: its 404


_TRANSCRIPT_SHAPE = shape_of(TranscriptPage)


@router.get(
    "/{task_id}/transcript",
    response_model=TranscriptPage,
    responses={**NOT_MODIFIED, **error_responses(404)},
)
def task_transcript(
    task_id: str,
    response: Response,
    generation: int | None = Query(default=None, ge=1, le=2**31 - 1),
    limit: int = Query(default=200, ge=1, le=1000),
    cursor: str | None = Query(default=None, max_length=512),
    if_none_match: str | None = IF_NONE_MATCH,
    service: TaskService = Depends(get_task_service),
) -> Any:
    """The durable transcript, oldest entry first: model turns and the tool results the model
    was shown, a page at a time. With the page's `ETag` in `If-None-Match`, `304` and no body
    while it is unchanged."""
    version = service.transcript_version(task_id, generation, limit=limit, cursor=cursor)
    if version is not None:
        unchanged = tagged(response, if_none_match, _TRANSCRIPT_SHAPE, version)
        if unchanged is not None:
            return unchanged
    return service.transcript(task_id, generation, limit=limit, cursor=cursor)


@router.post("/{task_id}/requeue", response_model=RequeuedView, responses=error_responses(404, 409))
def requeue_task(
    task_id: str,
    body: RequeueBody,
    request: Request,
    service: TaskService = Depends(get_task_service),
) -> dict[str, Any]:
    """A new generation now (a running one is fenced out); the requeue records who asked."""
    by = _asker(request, body.by)
    requeued = service.requeue_and_wake(task_id, body.reason, by=by)
    return task_view(requeued.task) | {"dispatched": requeued.wake_up.sent}


@router.post("/{task_id}/cancel", response_model=TaskView, responses=error_responses(404, 409))
def cancel_task(
    task_id: str,
    request: Request,
    body: CancelBody | None = None,
    service: TaskService = Depends(get_task_service),
) -> dict[str, Any]:
    """Fence the live generation and cancel the task; the reason it keeps names who asked."""
    body = body or CancelBody()
    return task_view(service.cancel(task_id, body.reason, by=_asker(request, body.by)))


def _asker(request: Request, by: str | None) -> str | None:
    """Who asks: an operator account by its name; the shared token by the body's `by`, or
    no one (the business backend's requeues and cancels name nobody unless it says)."""
    operator = current_operator(request)
    return by if operator.shared else operator.name
