"""What the business backend's answer means for a delivery: a permanent refusal (a 4xx other
than 408, 409, 425 and 429) is not retried; a `Retry-After` on 429 or 503 sets the earliest next
attempt, within the backoff's bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from orchestrator.services.delivery_answers import (
    backoff_seconds,
    is_permanent_refusal,
    retry_after_seconds,
)

NOW = datetime(2026, 12, 5, 8, 30, 0, tzinfo=UTC)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 410, 413, 415, 422, 418, 451, 499])
def test_a_client_error_is_a_permanent_refusal(status: int) -> None:
    assert is_permanent_refusal(status)


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504, 301, 302, 100, 600])
def test_timeouts_conflicts_rate_limits_and_server_errors_are_retried(status: int) -> None:
    assert not is_permanent_refusal(status)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
        ("Sat, 05 Dec 2026 08:31:00 GMT", 60.0),
        # A date already past asks for no wait at all (never a negative one).
        (format_datetime(NOW - timedelta(hours=1), usegmt=True), 0.0),
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value: str, seconds: float) -> None:
    assert retry_after_seconds(value, NOW) == seconds


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "12abc", "²", "Sat, 99 Foo"])
def test_a_retry_after_that_is_neither_is_ignored(value: str | None) -> None:
    assert retry_after_seconds(value, NOW) is None


def test_a_huge_retry_after_is_a_long_wait_not_an_error() -> None:
    assert retry_after_seconds("9" * 5000, NOW) == float("inf")


def test_the_backoff_doubles_per_attempt_up_to_its_maximum() -> None:
    assert [backoff_seconds(n, base=1.0, maximum=10.0) for n in (1, 2, 3, 4, 5)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        10.0,
    ]
    assert backoff_seconds(5000, base=1.0, maximum=300.0) == 300.0  # no float overflow


@pytest.mark.parametrize(
    ("attempts", "retry_after", "expected"),
    [
        (1, 120.0, 120.0),  # the backend's wait, later than the backoff's
        (1, float("inf"), 300.0),  # capped by the maximum
        (1, 1e9, 300.0),
        (4, 2.0, 8.0),  # never earlier than the backoff would be
        (4, 0.0, 8.0),
        (4, None, 8.0),
    ],
)
def test_retry_after_sets_the_earliest_next_attempt_within_the_bounds(
    attempts: int, retry_after: float | None, expected: float
) -> None:
    assert backoff_seconds(attempts, base=1.0, maximum=300.0, retry_after=retry_after) == expected
