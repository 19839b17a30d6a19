"""What the business backend's answer to a delivery means for its outbox row.

A 2xx delivers it. A client error the backend will give the same body for ever (400, 401, 403,
404, 422, ...: every 4xx but 408, 409, 425 and 429) is a permanent refusal: retrying only hammers
the backend, so the row is dead-lettered at once for an operator to look at. Everything else (the
four retryable 4xx, a 5xx, a timeout, a broken connection) is tried again after an exponential
backoff; on 429 and 503 the backend may say when with `Retry-After` (RFC 9110 section 10.2.3),
which sets the earliest next attempt, never earlier than the backoff and never past its maximum.
A 429 is the backend saying "later", not failing (a healthy backend rate-limiting a burst): it
backs off as the others do, but does not spend a webhook's ORCH_WEBHOOK_MAX_ATTEMPTS.

Pure functions of the status and the header's text: the dispatcher does the sending.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final

__all__ = [
    "RETRYABLE_CLIENT_ERRORS",
    "RETRY_AFTER_STATUSES",
    "THROTTLED",
    "backoff_seconds",
    "is_permanent_refusal",
    "retry_after_seconds",
]

#: Client errors that may pass: Request Timeout, Conflict, Too Early, Too Many Requests.
RETRYABLE_CLIENT_ERRORS: Final = frozenset({408, 409, 425, 429})
#: The answers whose `Retry-After` is honoured (RFC 9110: 503, and 429 by RFC 6585).
RETRY_AFTER_STATUSES: Final = frozenset({429, 503})
#: Too Many Requests: retried, and not counted as a failed attempt.
THROTTLED: Final = 429
#: The backoff doubles at most this many times (then it is the maximum, or a float's infinity).
_MAX_DOUBLINGS: Final = 1000
_DELAY_SECONDS = re.compile(r"[0-9]+")


def is_permanent_refusal(status: int) -> bool:
    """True when the backend refuses this body for good: a 4xx it will answer again."""
    return 400 <= status < 500 and status not in RETRYABLE_CLIENT_ERRORS


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """The wait a `Retry-After` value asks for, from `now` (0 for a date already past), or
    None when it is neither delay-seconds nor an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)  # digits beyond a float's range are infinity: capped by the caller
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110's IMF-fixdate is GMT; "-0000" parses as naive
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def backoff_seconds(
    attempts: int, *, base: float, maximum: float, retry_after: float | None = None
) -> float:
    """The wait before the next attempt after `attempts` failed ones: `base` doubled per
    attempt up to `maximum`; a backend's `retry_after` makes it longer, never past `maximum`."""
    # Attempts may grow without end (an operator retries, a 5xx backend never recovers), and
    # 2 ** 1024 no longer converts to a float: far below that, the maximum applies anyway.
    doublings = min(max(attempts - 1, 0), _MAX_DOUBLINGS)
    delay = min(base * 2.0**doublings, maximum)
    if retry_after is not None:
        delay = max(delay, min(retry_after, maximum))
    return delay
