"""Failed sign-ins per client address: a token cannot be guessed at the speed of the network.

Before, a wrong bearer token (or a wrong token in the console's sign-in form or `?token=` link)
was answered 401 as fast as it came: thousands of guesses a second from one machine. Each
address now has a leaky bucket of failures: `burst` wrong tokens at once, then one more every
`seconds_per_failure` seconds. An address over it is answered `429 too_many_failures` with
`Retry-After` (a few seconds) for anything that presents a token, the right one included:
a right token let through would tell the guesser it was right. A console session cookie is
not a guess (its MAC cannot be guessed), so a signed-in browser at that address works on,
and a request with no credentials at all is the usual 401, counted as nothing.

The account is not known from a wrong token (no credential names its account but the cookie),
so the count is per address: an IPv6 client counts by its /64, which one host usually holds
whole, and also by its /48 with `WIDE` times the burst and the rate: a home or a server is
often given a /56 or a /48, 256 to 65,536 /64s, each of which would otherwise have had a burst
of its own, and past `max_addresses` of them the least recently failed is forgotten, its burst
whole again: cycling through them, a /48 guessed without limit.

`FailedSignIns` keeps the buckets in this process's memory, at most `max_addresses` of them
(the least recently failed one goes first; a /48's is touched by every failure of its /64s,
so they cannot push it out): the embedded API's limit, whose check is one or two dict lookups.
With Redis configured, `shared_sign_ins.SharedFailedSignIns` keeps them in Redis by the same
rules, for every API process at once and across their restarts (a fleet of N processes behind
a balancer allowed N times the rate, each counting alone, and a restart forgot): one round
trip per request that presents a token, and this process's own count beside it for when Redis
does not answer. Either way the limit is asked about the requests that present a bearer token
(or the console's sign-in form or link) only, never one with no token or the cookie alone; a
token is looked at first, but its answer is given only if the address is within its limit.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from orchestrator.errors import OrchestratorError

__all__ = [
    "FailedSignIns",
    "SignInLimit",
    "TooManyFailures",
    "client_address",
    "refuse_after",
    "tipped_over",
]

log = logging.getLogger(__name__)

BURST = 20
SECONDS_PER_FAILURE = 6.0
MAX_ADDRESSES = 10_000
#: A /48's bucket against its /64s': this many times the burst, drained this many times faster.
WIDE = 16


class TooManyFailures(OrchestratorError):
    """Too many wrong tokens from the caller's address: try again after `retry_after` s."""

    code = "too_many_failures"
    http_status = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many wrong tokens from your address; try again in {retry_after} s")
        self.retry_after = retry_after


def client_address(client: object) -> str:
    """The key an ASGI `scope["client"]` counts under: its address, an IPv6 one's /64."""
    host = client[0] if isinstance(client, (tuple, list)) and client else ""
    return _key(str(host))


@functools.lru_cache(maxsize=4096)
def _wider(key: str) -> str | None:
    """The /48 an IPv6 key's /64 is in (counted too), None for any other key."""
    if not key.endswith("/64"):
        return None
    try:
        network = ipaddress.IPv6Network(key)
    except ValueError:
        return None
    return str(network.supernet(new_prefix=48))


@functools.lru_cache(maxsize=4096)
def _key(text: str) -> str:
    # Cached: parsing an address costs twice the whole token check of a right token.
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text  # a unix socket, a test client: one key for all of them
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class SignInLimit(Protocol):
    """What a token check asks: `FailedSignIns` (this process's memory) or, with Redis,
    `shared_sign_ins.SharedFailedSignIns` (every API process's)."""

    def attempt(self, address: str, *, wrong: bool) -> None:
        """`TooManyFailures` while `address` may not present a token, else count a wrong one."""

    async def attempt_async(self, address: str, *, wrong: bool) -> None:
        """`attempt` from the event loop, which it never holds up."""

    def close(self) -> None:
        """Let go of what it holds (a connection)."""


class FailedSignIns:
    """Per address, a level of recent failures that drains at one per `seconds_per_failure`."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        seconds_per_failure: float = SECONDS_PER_FAILURE,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.seconds_per_failure = seconds_per_failure
        self.max_addresses = max_addresses
        self.clock = clock
        # address -> (level, when it was that): the least recently failed first.
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()
        # The console's sign-in runs on the thread pool, the middleware on the event loop.
        self._lock = threading.Lock()

    def buckets(self, address: str) -> list[tuple[str, int, float]]:
        """The buckets a failure from `address` counts in: (key, burst, seconds per failure)."""
        buckets = [(address, self.burst, self.seconds_per_failure)]
        wider = _wider(address)
        if wider is not None:
            buckets.append((wider, self.burst * WIDE, self.seconds_per_failure / WIDE))
        return buckets

    def _level(self, key: str, now: float, seconds_per_failure: float) -> float:
        level, at = self._levels.get(key, (0.0, now))
        return max(0.0, level - (now - at) / seconds_per_failure)

    def wait(self, address: str) -> float:
        """How many seconds `address` must wait before it may present a token; 0 when it may."""
        buckets = self.buckets(address)
        if all(key not in self._levels for key, _, _ in buckets):  # the usual case: no lock
            return 0.0
        wait = 0.0
        with self._lock:
            now = self.clock()
            for key, burst, seconds in buckets:
                level = self._level(key, now, seconds)
                if level > burst - 1:
                    wait = max(wait, (level - (burst - 1)) * seconds)
        return wait

    def check(self, address: str) -> None:
        """`TooManyFailures` while `address` may not present a token."""
        refuse_after(self.wait(address))

    def attempt(self, address: str, *, wrong: bool) -> None:
        """A token from `address`: `TooManyFailures` while it may not present one (whether
        right or not: it is not counted then), else a wrong one is counted."""
        self.check(address)
        if wrong:
            self.failed(address)

    async def attempt_async(self, address: str, *, wrong: bool) -> None:
        """`attempt` from the event loop (it never waits here: dict look-ups)."""
        self.attempt(address, wrong=wrong)

    def close(self) -> None:
        """Nothing to let go of."""

    def count(self, address: str) -> list[tuple[str, int]]:
        """Count a wrong token from `address`; the buckets it tipped over, (key, burst)."""
        tipped: list[tuple[str, int]] = []
        with self._lock:
            now = self.clock()
            for key, burst, seconds in self.buckets(address):
                before = self._level(key, now, seconds)
                self._levels[key] = (before + 1, now)
                self._levels.move_to_end(key)
                if before <= burst - 1 < before + 1:
                    tipped.append((key, burst))
            while len(self._levels) > self.max_addresses:
                self._levels.popitem(last=False)
        return tipped

    def failed(self, address: str) -> None:
        """Count a wrong token from `address` (and log a bucket it tips over)."""
        for key, burst in self.count(address):
            tipped_over(key, burst)


def refuse_after(wait: float) -> None:
    """`TooManyFailures` when `wait` (seconds) is more than nothing."""
    if wait > 0:
        raise TooManyFailures(max(1, math.ceil(wait)))


def tipped_over(key: str, burst: int) -> None:
    """Said once as a bucket tips over (never the token: only where the guesses come from)."""
    log.warning(
        "%d wrong tokens in a row from %s: its tokens are refused (429) for a while", burst, key
    )
