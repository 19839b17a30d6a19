"""What a task has on record whichever session or generation wrote it: its current plan and the
evidence the host recorded for it (operators, the console, collaboration answers).

The evidence is read a page at a time, oldest first: a task with thousands of records answered
all of them at once (~700 KB, and a console page of ~22,700 elements). The records a report or a
plan node cites can be asked for by id, so a cited record on a later page is still shown."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orchestrator.domain.cursors import decode_cursor, encode_cursor
from orchestrator.domain.pages import EVIDENCE_PAGE, EVIDENCE_PAGE_MAX
from orchestrator.domain.storable import storable_text
from orchestrator.errors import NotFound, ValidationFailed, echoed
from orchestrator.store import evidence as evidence_store
from orchestrator.store import task_plans
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.tables import ID

__all__ = ["EVIDENCE_PAGE", "EVIDENCE_PAGE_MAX", "TaskRecords"]


class TaskRecords:
    def __init__(self, db: Database) -> None:
        self.db = db

    def plan(self, task_id: str) -> dict[str, Any]:
        """`{"task_id", "plan"}`: the task's latest revision (None before its first plan)."""
        with self.db.transaction(readonly=True) as conn:
            if task_store.get_task(conn, task_id) is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            plan = task_plans.task_latest_plan(conn, task_id)
        return {"task_id": task_id, "plan": plan.to_dict() if plan else None}

    def evidence_version(
        self,
        task_id: str,
        *,
        limit: int = EVIDENCE_PAGE,
        cursor: str | None = None,
        ids: Sequence[str] | None = None,
    ) -> tuple[Any, ...] | None:
        """What `evidence(...)` with the same arguments would answer, summed up by the keys of
        its records (read from the index; a record never changes); None when there is no such
        task. Refuses what `evidence` refuses, alike."""
        after, wanted = _checked_page(limit, cursor, ids)
        with self.db.transaction(readonly=True) as conn:
            keys = evidence_store.evidence_keys(conn, task_id, limit=limit, after=after, ids=wanted)
            if not keys and task_store.get_task(conn, task_id) is None:
                return None
        return (limit, after, tuple(sorted(wanted)) if wanted is not None else None, *keys)

    def evidence(
        self,
        task_id: str,
        *,
        limit: int = EVIDENCE_PAGE,
        cursor: str | None = None,
        ids: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """`{"items", "next_cursor"}`: a page of the task's evidence records, oldest first,
        after `cursor` (a previous page's `next_cursor`); only the records among `ids` when
        given (an id of no record of this task is left out). `next_cursor` is None on the last
        page."""
        after, wanted = _checked_page(limit, cursor, ids)
        with self.db.transaction(readonly=True) as conn:
            if task_store.get_task(conn, task_id) is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            items, last = evidence_store.evidence_page(
                conn, task_id, limit=limit, after=after, ids=wanted
            )
        return {"items": items, "next_cursor": encode_cursor(*last) if last else None}


def _checked_page(
    limit: int, cursor: str | None, ids: Sequence[str] | None
) -> tuple[tuple[datetime, str] | None, list[str] | None]:
    """The page asked for as the store reads it (`after`, the ids), or a 422."""
    if not 1 <= limit <= EVIDENCE_PAGE_MAX:
        raise ValidationFailed(
            f"limit must be between 1 and {EVIDENCE_PAGE_MAX}", code="invalid_limit"
        )
    after = decode_cursor(cursor) if cursor else None
    return after, _checked_ids(ids) if ids is not None else None


def _checked_ids(ids: Sequence[str]) -> list[str]:
    """`ids` as the store can be asked for them, or a 422 naming what is wrong: at most
    EVIDENCE_PAGE_MAX, each text an id column holds (a NUL would fail in Postgres)."""
    if len(ids) > EVIDENCE_PAGE_MAX:
        raise ValidationFailed(
            f"at most {EVIDENCE_PAGE_MAX} evidence ids at once, not {len(ids)}",
            code="too_many_ids",
        )
    for evidence_id in ids:
        try:
            storable_text(evidence_id)
            if not 0 < len(evidence_id) <= ID:
                raise ValueError(f"an evidence id is 1 to {ID} characters")
        except ValueError as exc:
            raise ValidationFailed(
                f"invalid evidence id {echoed(evidence_id)}: {exc}", code="invalid_evidence_id"
            ) from None
    return list(ids)
