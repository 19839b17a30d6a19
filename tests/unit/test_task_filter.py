"""The task list's filter: every problem listed, the first one's code, times in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from orchestrator.domain.task_filter import TaskFilter, task_filter
from orchestrator.errors import ValidationFailed


def test_an_empty_filter_keeps_everything() -> None:
    assert task_filter() == TaskFilter()


def test_times_become_aware_utc() -> None:
    naive = datetime(2026, 12, 1, 8, 0)
    zoned = datetime(2026, 12, 1, 10, 0, tzinfo=timezone(timedelta(hours=2)))
    found = task_filter(created_after=naive, created_before=zoned + timedelta(hours=1))
    assert found.created_after == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert found.created_before == datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def test_every_problem_is_listed_with_its_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        task_filter(
            status="sleeping",
            task_type="no spaces",
            created_after=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        )
    assert caught.value.code == "invalid_status"
    assert [(d["code"], d["field"]) for d in caught.value.details] == [
        ("invalid_status", "status"),
        ("invalid_task_type", "task_type"),
        ("invalid_time", "created_after"),
    ]


@pytest.mark.parametrize("hours", [0, -1])
def test_an_empty_or_reversed_range_is_refused(hours: int) -> None:
    moment = datetime(2026, 12, 1, tzinfo=UTC)
    with pytest.raises(ValidationFailed) as caught:
        task_filter(created_after=moment, created_before=moment + timedelta(hours=hours))
    assert caught.value.code == "invalid_time_range"


@pytest.mark.parametrize("task_type", ["", "x" * 65, "a/b", "a\x00"])
def test_a_bad_task_type_is_refused(task_type: str) -> None:
    with pytest.raises(ValidationFailed, match="task type"):
        task_filter(task_type=task_type)
