"""`GET /api/v1/tasks/{task_id}/plan` and `/evidence`: a task's record across its generations.

The evidence is a page at a time, oldest first, like every list; `id` asks for the records a
report or a plan node cites, wherever they fall in the pages (the console shows them beside the
first page)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Response

from orchestrator.api.contract import Page, error_responses
from orchestrator.api.deps import get_db
from orchestrator.api.etags import IF_NONE_MATCH, NOT_MODIFIED, shape_of, tagged
from orchestrator.api.models import EvidenceView
from orchestrator.api.plan_views import TaskPlanView
from orchestrator.services.task_records import EVIDENCE_PAGE, EVIDENCE_PAGE_MAX, TaskRecords
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


#: Part of every tag of an evidence page: a client holding an older API's page gets the new one.
_EVIDENCE_SHAPE = shape_of(Page[EvidenceView])


@router.get(
    "/{task_id}/evidence",
    response_model=Page[EvidenceView],
    responses={**NOT_MODIFIED, **error_responses(404)},
)
def task_evidence(
    task_id: str,
    response: Response,
    limit: int = Query(default=EVIDENCE_PAGE, ge=1, le=EVIDENCE_PAGE_MAX),
    cursor: str | None = Query(
        default=None,
        max_length=512,
        description="`next_cursor` of the previous page, asked with the same `id`s",
    ),
    ids: list[str] | None = Query(
        default=None,
        alias="id",
        description=f"only these records (repeat `id`, at most {EVIDENCE_PAGE_MAX}): the ones a "
        "report or a node cites; an id of no record of this task is left out",
    ),
    if_none_match: str | None = IF_NONE_MATCH,
    db: Database = Depends(get_db),
) -> Any:
    """The evidence records the host wrote for the task, oldest first, a page at a time; follow
    `next_cursor` for the records after. With the `ETag` of the page it holds in
    `If-None-Match`, a client gets `304` and no body while the page is unchanged."""
    records = TaskRecords(db)
    version = records.evidence_version(task_id, limit=limit, cursor=cursor, ids=ids)
    if version is not None:
        unchanged = tagged(response, if_none_match, _EVIDENCE_SHAPE, version)
        if unchanged is not None:
            return unchanged
    return records.evidence(task_id, limit=limit, cursor=cursor, ids=ids)
