"""Which tasks a list shows: status, task type and a created-time range, checked in one place.

The API's query parameters and the CLI's options both become a `TaskFilter`, so both refuse the
same values with the same codes. The range is half-open, `created_after <= created_at <
created_before`, so consecutive ranges neither overlap nor leave a gap. A time without a zone
is read as UTC. The filter combines with keyset paging: the cursor names the last row seen, and
the next page is the same filter's rows after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from orchestrator.domain.vocabulary import TASK_STATUSES
from orchestrator.errors import ValidationFailed

__all__ = ["TASK_TYPE_MAX", "TASK_TYPE_PATTERN", "TaskFilter", "as_utc", "task_filter"]

#: What a task type may be (the trigger's own rule).
TASK_TYPE_PATTERN: Final = r"^[A-Za-z0-9_.:-]+$"
TASK_TYPE_MAX: Final = 64


@dataclass(frozen=True)
class TaskFilter:
    """Rows a task list keeps; None is "any"."""

    status: str | None = None
    task_type: str | None = None
    created_after: datetime | None = None  # inclusive, aware UTC
    created_before: datetime | None = None  # exclusive, aware UTC


def as_utc(moment: datetime) -> datetime | None:
    """`moment` in UTC (a naive one is taken as UTC); None when it cannot be converted (an
    offset that moves it past the ends of the calendar)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        return None


def _problem(code: str, field: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "field": field}


def task_filter(
    *,
    status: str | None = None,
    task_type: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> TaskFilter:
    """A checked filter; `ValidationFailed` (422) listing every problem, the first one's code."""
    problems: list[dict[str, Any]] = []
    if status is not None and status not in TASK_STATUSES:
        message = f"unknown status {status!r}; one of {', '.join(TASK_STATUSES)}"
        problems.append(_problem("invalid_status", "status", message))
    if task_type is not None and (
        len(task_type) > TASK_TYPE_MAX or not re.fullmatch(TASK_TYPE_PATTERN, task_type)
    ):
        message = f"a task type is 1..{TASK_TYPE_MAX} of A-Z a-z 0-9 _ . : -"
        problems.append(_problem("invalid_task_type", "task_type", message))
    after = as_utc(created_after) if created_after is not None else None
    before = as_utc(created_before) if created_before is not None else None
    for field, given, converted in (
        ("created_after", created_after, after),
        ("created_before", created_before, before),
    ):
        if given is not None and converted is None:
            message = "the time is outside the calendar once converted to UTC"
            problems.append(_problem("invalid_time", field, message))
    if after is not None and before is not None and after >= before:
        message = "created_after must be earlier than created_before"
        problems.append(_problem("invalid_time_range", "created_before", message))
    if problems:
        raise ValidationFailed(problems[0]["message"], code=problems[0]["code"], details=problems)
    return TaskFilter(status, task_type, after, before)
