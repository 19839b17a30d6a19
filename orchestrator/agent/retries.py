"""When to retry a model call: jittered exponential backoff that honours `Retry-After`.

Pure rules, no I/O: the client asks `RetryBudget.next_delay` after a retryable failure and
either waits that long or gives up with the reason. The budget is both a number of retries
(`LLM_MAX_RETRIES`) and a point in time (the round's lease is vouched for until then): a retry
that could only start after it is not attempted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["RetryBudget", "parse_retry_after", "should_retry"]

#: The longest single wait, whatever the server asks for (a longer one is not honoured: give up).
MAX_WAIT_SECONDS = 60.0


def should_retry(status: int, headers: Mapping[str, str] | None = None) -> bool:
    """Is an HTTP `status` from the model server worth another attempt?

    The openai client's own rules (`openai._base_client.BaseClient._should_retry`), which the
    client would apply if its retries were on: the server's `x-should-retry: true|false` first,
    then 408 (request timeout), 409 (lock timeout), 429 (rate limit) and every 5xx. Its rule on a
    long `Retry-After` is `RetryBudget`'s, bounded by the round's lease.
    """
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    said = lowered.get("x-should-retry")
    if said == "true":
        return True
    if said == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def parse_retry_after(headers: dict[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.fromtimestamp(now if now is not None else time.time(), tz=UTC)
    return max(0.0, (when - current).total_seconds())


@dataclass
class RetryBudget:
    """The retries one model call may still make."""

    max_retries: int
    #: Monotonic time until which the lease is vouched for; None = no limit.
    deadline: Callable[[], float] | None = None
    base_seconds: float = 0.5
    cap_seconds: float = 20.0
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    used: int = 0

    def next_delay(self, retry_after: float | None) -> float | str:
        """Seconds to wait before the next attempt, or why there is none."""
        if self.used >= self.max_retries:
            return f"gave up after {self.used} retries (LLM_MAX_RETRIES={self.max_retries})"
        if retry_after is not None:
            if retry_after > MAX_WAIT_SECONDS:
                return f"the server asked to wait {retry_after:g}s (Retry-After), too long"
            # A little jitter on top, so a fleet told the same time does not return at once.
            delay = retry_after + self.rng.uniform(0, min(1.0, retry_after * 0.1 + 0.05))
        else:
            ceiling = min(self.cap_seconds, self.base_seconds * (2**self.used))
            delay = self.rng.uniform(ceiling / 2, ceiling)
        if self.deadline is not None and self.clock() + delay >= self.deadline():
            return f"a retry in {delay:.1f}s would outlast the round's lease"
        self.used += 1
        return delay
