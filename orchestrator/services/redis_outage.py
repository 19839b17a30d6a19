"""What the sweeper says about Redis (its leases and its broker) not answering: one warning
when an outage begins, one line when Redis answers again, nothing at the sweeps in between.

A sweep reaches Redis for its broker mark (every sweep), for the leases of expired generations
and for the wake-ups it sends. Each failure used to say itself at each sweep, or not at all: the
mark's failure was silent, so an idle fleet's sweeper said nothing for a whole outage, while one
with a recorded wake-up repeated the dispatcher's line every sweep and never said when it ended.
The sweeper now notes what it could not do in a sweep (`missed`) and, at the sweep's end, hands
it to `RedisOutage.swept`, which decides what to say.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["RedisOutage", "SweepMisses", "where"]

log = logging.getLogger("orchestrator.services.sweeper")


@dataclass
class SweepMisses:
    """What one sweep could not do because Redis did not answer, and the first error."""

    error: str | None = None
    unchecked: int = 0  # expired generations whose leases could not be read
    unsent: int = 0  # wake-ups the broker did not take (recorded in the store)
    unreleased: int = 0  # leases of gone processes left to expire
    mark: bool = False  # the broker mark (to notice Redis losing its data) not kept

    def note(self, error: BaseException | str) -> None:
        if self.error is None:
            text = error if isinstance(error, str) else _one_line(error)
            self.error = text

    def describe(self) -> str:
        parts = []
        if self.unchecked:
            parts.append(f"{self.unchecked} expired generation(s) not checked (left expired)")
        if self.unsent:
            parts.append(
                f"{self.unsent} wake-up(s) not sent (recorded in the store, sent first once "
                "it answers)"
            )
        if self.unreleased:
            parts.append(f"{self.unreleased} gone worker's lease(s) not released (they expire)")
        if self.mark:
            parts.append("its mark (to notice Redis losing its data) not kept")
        return "; ".join(parts)


@dataclass
class RedisOutage:
    """Whether Redis is away for the sweeper, since when, and the lines that say so."""

    where: str
    retry_seconds: float
    clock: Callable[[], float] = time.monotonic
    since: float | None = None

    def swept(self, misses: SweepMisses) -> None:
        """After a sweep that reached Redis (`misses.error` None) or did not."""
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        now = self.clock()
        if misses.error is not None:
            if self.since is None:
                self.since = now
                log.warning(
                    "%s does not answer (%s): this sweep had %s; the sweeper tries again at "
                    "every sweep (every %gs) and says when Redis answers again",
                    self.where,
                    misses.error,
                    misses.describe() or "nothing to send",
                    self.retry_seconds,
                )
            metrics.SWEEPER_REDIS_UNREACHABLE.set(now - self.since)
            return
        if self.since is not None:
            log.info(
                "%s answers again after %.0fs: expired leases are checked and the recorded "
                "wake-ups sent from this sweep on",
                self.where,
                now - self.since,
            )
            self.since = None
        metrics.SWEEPER_REDIS_UNREACHABLE.set(0)


def where(redis_url: str) -> str:
    """`Redis at HOST:PORT` (or at its socket path), never the URL's password."""
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return f"Redis at {parts.path}"
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"Redis at {host}:{port}"


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
