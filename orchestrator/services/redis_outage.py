"""What the sweeper says about Redis (its leases and its broker) not answering: one warning
when an outage begins, one line when Redis answers again, nothing at the sweeps in between.

A sweep reaches Redis for its broker mark (every sweep), for the leases of expired generations
and for the wake-ups it sends. Each failure used to say itself at each sweep, or not at all: the
mark's failure was silent, so an idle fleet's sweeper said nothing for a whole outage, while one
with a recorded wake-up repeated the dispatcher's line every sweep and never said when it ended.
The sweeper now notes what it could not do in a sweep (`missed`) and, at the sweep's end, hands
it to `RedisOutage.swept`, which decides what to say.

Only an error of the connection (refused, reset, timed out, Redis loading its data) is an
outage. A Redis that answers but refuses (a full server under `noeviction`, a read-only replica,
a password or ACL that no longer takes the sweeper's) was said as "does not answer" and counted
in the outage gauge: waiting for it to come back mends nothing, so it is said as what it is,
once, and one line says when Redis takes the sweeper's commands again. The outage gauge reads
the time since the first failed attempt from the outage's first sweep on (it read 0 there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

__all__ = ["RedisOutage", "SweepMisses", "kind_of", "where"]

#: What a failed call to Redis was: no answer (an outage), or an answer that refused it.
Kind = Literal["unreachable", "credentials", "refused", "failed"]

#: How a refusal's line begins, after `Redis at HOST:PORT`.
_REFUSALS: Final[dict[str, str]] = {
    "credentials": "answers but refuses the sweeper's credentials",
    "refused": "answers but refused a command",
    "failed": "answers, but a call of the sweeper's failed",
}

log = logging.getLogger("orchestrator.services.sweeper")


@dataclass
class SweepMisses:
    """What one sweep could not do because Redis did not answer, and the first error."""

    error: str | None = None  # the first error of the connection (Redis does not answer)
    #: When that first failed attempt was made (time.monotonic()).
    first_at: float | None = None
    #: The first error of a Redis that answered but refused, and what kind of refusal.
    refused: str | None = None
    refusal: Kind | None = None
    unchecked: int = 0  # expired generations whose leases could not be read
    unsent: int = 0  # wake-ups the broker did not take (recorded in the store)
    unreleased: int = 0  # leases of gone processes left to expire
    mark: bool = False  # the broker mark (to notice Redis losing its data) not kept

    def note(self, error: BaseException | str) -> None:
        kind: Kind = "unreachable"  # a line already written: as before, an outage
        text = error if isinstance(error, str) else ""
        if not isinstance(error, str):
            kind, said = kind_of(error)
            text = _one_line(said)
        if kind == "unreachable":
            if self.error is None:
                self.error, self.first_at = text, time.monotonic()
        elif self.refused is None:
            self.refused, self.refusal = text, kind

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

    #: The kind of refusal said, while Redis answers but refuses (no outage).
    refusing: Kind | None = None

    def swept(self, misses: SweepMisses) -> None:
        """After a sweep that reached Redis (`misses.error` None) or did not."""
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        gauge = metrics.sweeper_redis_unreachable()
        now = self.clock()
        if misses.error is not None:
            self.refusing = None  # an outage's line says the rest
            if self.since is None:
                # From its first failed attempt: the outage's first sweep reads more than 0.
                self.since = min(now, misses.first_at if misses.first_at is not None else now)
                log.warning(
                    "%s does not answer (%s): this sweep had %s; the sweeper tries again at "
                    "every sweep (every %gs) and says when Redis answers again",
                    self.where,
                    misses.error,
                    misses.describe() or "nothing to send",
                    self.retry_seconds,
                )
            gauge.set(now - self.since)
            return
        gauge.set(0)  # Redis answers, whatever it answered
        if misses.refused is not None and misses.refusal is not None:
            self.since = None  # the refusal's line says that Redis answers
            if self.refusing != misses.refusal:
                self.refusing = misses.refusal
                log.warning(
                    "%s %s (%s): this sweep had %s; this is no outage (waiting for Redis mends "
                    "nothing): the sweeper tries again at every sweep (every %gs) and says "
                    "when Redis takes its commands again",
                    self.where,
                    _REFUSALS[misses.refusal],
                    misses.refused,
                    misses.describe() or "nothing to send",
                    self.retry_seconds,
                )
            return
        if self.refusing is not None:
            log.info(
                "%s takes the sweeper's commands again: expired leases are checked and the "
                "recorded wake-ups sent from this sweep on",
                self.where,
            )
            self.refusing = None
        if self.since is not None:
            log.info(
                "%s answers again after %.0fs: expired leases are checked and the recorded "
                "wake-ups sent from this sweep on",
                self.where,
                now - self.since,
            )
            self.since = None


def kind_of(error: BaseException) -> tuple[Kind, BaseException]:
    """What a failed call to Redis was, and the error that says it (the cause a wrapper such
    as Kombu's `OperationalError` or `LeaseBackendUnavailable` carries, when it is more
    precise): an error of the connection is `unreachable`; an answer that refused the
    credentials, `credentials`; one that refused a command (full, read-only, not permitted),
    `refused`; anything else, `failed`."""
    from redis import exceptions as rx

    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for cause in chain:  # redis-py's AuthenticationError is one of its ConnectionErrors
        if isinstance(cause, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError):
            return "credentials", cause
        if isinstance(cause, rx.ResponseError):
            return "refused", cause
    for cause in chain:
        if isinstance(cause, rx.ConnectionError | rx.TimeoutError | OSError):
            return "unreachable", error
    if any(_broker_connection_error(cause) for cause in chain):
        return "unreachable", error
    return "failed", error


def _broker_connection_error(error: BaseException) -> bool:
    """Kombu's error for a connection it could not make or keep (no cause more precise)."""
    try:
        from kombu.exceptions import OperationalError
    except ImportError:  # pragma: no cover - Celery (and Kombu) are dependencies
        return False
    return isinstance(error, OperationalError)


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
