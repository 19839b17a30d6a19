"""Wrong tokens counted in Redis: one limit for every API process, kept across their restarts.

`sign_in_limit.FailedSignIns` counts in one process's memory: N API processes behind a balancer
let N times the guesses through, and a restarted one forgets. With ORCH_REDIS_URL set, each
bucket (an address, an IPv6 /64 and its /48, by the same burst, rate and `WIDE` rules) is one
Redis key (`leases.keys.sign_in_key`) that a Lua script reads, drains by Redis's own clock and
counts in one round trip per request that presents a token; it expires when its level would
have drained to nothing, so an idle bucket leaves no key.

The process keeps its own count as well, as `FailedSignIns` would, and holds to it whatever
Redis says: a Redis that does not answer (within `SOCKET_TIMEOUT_SECONDS`, or at all) or that
restarted empty never lets an address through that this process alone would refuse, and never
turns a sign-in into a 500. After a failed round trip Redis is left alone for `RETRY_SECONDS`
(the process's count decides meanwhile); the outage is logged once, and its end once.

redis-py is imported here, where the Redis side runs (the app imports this module only when
Redis is configured).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial

import anyio.to_thread
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from orchestrator.api.sign_in_limit import FailedSignIns, refuse_after, tipped_over
from orchestrator.leases.keys import sign_in_key
from orchestrator.services.redis_outage import Kind, kind_of

__all__ = ["RETRY_SECONDS", "SOCKET_TIMEOUT_SECONDS", "SharedFailedSignIns"]

log = logging.getLogger(__name__)

#: How long one round trip may take before this process's own count decides.
SOCKET_TIMEOUT_SECONDS = 0.5
#: How long Redis is left alone after it did not answer.
RETRY_SECONDS = 1.0
#: The outage line's words for what failed (`redis_outage.kind_of`): a Redis full under
#: `noeviction`, or one whose password changed, answers; sending the operator to the network
#: for it would mislead.
_WHAT_FAILED: dict[Kind, str] = {
    "unreachable": "does not answer",
    "credentials": "refuses the API's credentials",
    "refused": "answers but refused the sign-in count",
    "failed": "failed the sign-in count",
}

# KEYS the buckets; ARGV[1] '1' to count a wrong token, '0' to check only; ARGV[2i] the burst
# and ARGV[2i + 1] the milliseconds per failure of KEYS[i]. Each value is `level at_ms`.
# Returns {wait_ms, tipped_1, ...}: wait_ms > 0 refuses (nothing counted), tipped_i is 1 when
# the count tipped KEYS[i] over its burst (for the one log line).
_ATTEMPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local levels = {}
local wait = 0
for i, key in ipairs(KEYS) do
  local burst = tonumber(ARGV[2 * i])
  local per = tonumber(ARGV[2 * i + 1])
  local level = 0
  local value = redis.call('GET', key)
  if value then
    local stored, at = string.match(value, '^(%S+) (%S+)$')
    if stored then
      level = math.max(0, tonumber(stored) - math.max(0, now - tonumber(at)) / per)
    end
  end
  levels[i] = level
  if level > burst - 1 then
    wait = math.max(wait, (level - (burst - 1)) * per)
  end
end
if wait > 0 then return {math.ceil(wait)} end
local reply = {0}
for i, key in ipairs(KEYS) do
  reply[i + 1] = 0
  if ARGV[1] == '1' then
    local burst = tonumber(ARGV[2 * i])
    local per = tonumber(ARGV[2 * i + 1])
    local level = levels[i] + 1
    redis.call('SET', key, string.format('%.6f %.3f', level, now), 'PX', math.ceil(level * per))
    if levels[i] <= burst - 1 and burst - 1 < level then reply[i + 1] = 1 end
  end
end
return reply
"""


class SharedFailedSignIns:
    """`FailedSignIns`' limit, counted in Redis for every API process (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        local: FailedSignIns | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.local = local or FailedSignIns()
        self.retry_seconds = retry_seconds
        # One retry at once, of a broken connection only (one a restarted Redis dropped is
        # opened again), not of a timeout, which would wait as long again; redis-py's default
        # tries ten times with back-off, seconds in all, while a sign-in waits.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )
        self._script = self._client.register_script(_ATTEMPT)
        self._lock = threading.Lock()
        self._away_until = 0.0  # time.monotonic() before which Redis is not asked
        self._failing = False

    def attempt(self, address: str, *, wrong: bool) -> None:
        """`TooManyFailures` while `address` may not present a token, by Redis's count or this
        process's; else a wrong one is counted in both. Waits on Redis (off the event loop)."""
        mine = self.local.wait(address)
        shared = self._shared(address, wrong=wrong and mine == 0)
        if shared is None:  # Redis did not answer: this process's count alone
            self.local.attempt(address, wrong=wrong)
            return
        wait, tipped = shared
        refuse_after(max(mine, wait))
        if wrong:
            self.local.count(address)
            for key, burst in tipped:
                tipped_over(key, burst)

    async def attempt_async(self, address: str, *, wrong: bool) -> None:
        """`attempt` on a worker thread, so that a Redis slow to answer holds up this request
        alone; while Redis is left alone, at once."""
        if time.monotonic() < self._away_until:
            self.local.attempt(address, wrong=wrong)
            return
        await anyio.to_thread.run_sync(partial(self.attempt, address, wrong=wrong))

    def close(self) -> None:
        self._client.close()

    def _shared(self, address: str, *, wrong: bool) -> tuple[float, list[tuple[str, int]]] | None:
        """Redis's wait (seconds) for `address` and the buckets a count tipped over; None when
        Redis does not answer (or was left alone)."""
        if time.monotonic() < self._away_until:
            return None
        buckets = self.local.buckets(address)
        arguments: list[str | int | float] = ["1" if wrong else "0"]
        for _, burst, seconds in buckets:
            arguments += [burst, seconds * 1000]
        try:
            reply = self._script(keys=[sign_in_key(key) for key, _, _ in buckets], args=arguments)
        except redis.RedisError as exc:
            self._lost(exc)
            return None
        if self._failing:
            self._answers()
        wait_ms, *flags = (int(value) for value in reply)
        counted = zip(buckets, flags, strict=False)  # no flags on a refusal
        tipped = [(key, burst) for (key, burst, _), flag in counted if flag]
        return wait_ms / 1000, tipped

    def _lost(self, exc: redis.RedisError) -> None:
        with self._lock:
            self._away_until = time.monotonic() + self.retry_seconds
            first, self._failing = not self._failing, True
        if first:
            kind, error = kind_of(exc)
            cause = (str(error).strip().splitlines() or [""])[0]
            log.warning(
                "Redis %s (%s: %s): wrong sign-in tokens are counted by each API process on "
                "its own until it takes them again",
                _WHAT_FAILED[kind],
                type(error).__name__,
                cause,
            )

    def _answers(self) -> None:
        with self._lock:
            was, self._failing = self._failing, False
        if was:
            log.info("Redis answers again: wrong sign-in tokens are counted for every API process")
