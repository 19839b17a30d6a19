"""Leases in Redis: `SET NX PX` to take one, token-comparing Lua scripts to renew and release.

Expiry is Redis's own (`PX`, server side), so a worker's clock never decides who holds a lease.
Each lease is one string key (see `keys.py`) holding `token|acquired_ms|renewed_ms|holder`;
the timestamps are the client's wall clock in UTC and are informational only.
Needs Redis 7.0 or later (`SET ... NX GET`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from orchestrator.leases.base import (
    LeaseBackend,
    LeaseBackendUnavailable,
    LeaseInfo,
    Renewal,
    check_holder,
    check_name,
    new_token,
    ttl_milliseconds,
)
from orchestrator.leases.keys import lease_key

__all__ = ["RedisLeaseBackend", "connect_redis"]

T = TypeVar("T")

# A renewal must fail fast enough for the heartbeat to notice within one renew interval, so a
# few short retries replace redis-py's default exponential backoff of up to ten seconds.
SOCKET_TIMEOUT_SECONDS = 2.0
RETRIES = 2

# KEYS[1] lease key; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] renewed-at ms.
# Token compare and re-set in one script: renewal is one round trip and cannot race a takeover.
_RENEW = """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local token, acquired, _, holder = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
if token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], token .. '|' .. acquired .. '|' .. ARGV[3] .. '|' .. holder,
           'PX', ARGV[2])
return 1
"""

# KEYS lease keys; ARGV[1] ttl ms, ARGV[2] renewed-at ms, ARGV[2 + i] the token of KEYS[i].
# `_RENEW` for many leases in one round trip (one process's heartbeat): a list of 1 or 0.
_RENEW_MANY = """
local renewed = {}
for i, key in ipairs(KEYS) do
  renewed[i] = 0
  local value = redis.call('GET', key)
  if value then
    local token, acquired, _, holder = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
    if token == ARGV[2 + i] then
      redis.call('SET', key, token .. '|' .. acquired .. '|' .. ARGV[2] .. '|' .. holder,
                 'PX', ARGV[1])
      renewed[i] = 1
    end
  end
end
return renewed
"""

# KEYS lease keys; ARGV[1] ttl ms, ARGV[2] now ms, ARGV[3] '1' to take back a lease nobody holds
# (its key gone) or '0' to leave it free, ARGV[2 + 2i] the token and ARGV[3 + 2i] the holder of
# KEYS[i]. `_RENEW_MANY` that also finds a free lease: a list of 0 (refused), 1 (renewed),
# 2 (taken back) or 3 (free, left so).
_KEEP_MANY = """
local kept = {}
for i, key in ipairs(KEYS) do
  kept[i] = 0
  local token = ARGV[2 + 2 * i]
  local value = redis.call('GET', key)
  if not value then
    if ARGV[3] == '1' then
      redis.call('SET', key, token .. '|' .. ARGV[2] .. '|' .. ARGV[2] .. '|' .. ARGV[3 + 2 * i],
                 'PX', ARGV[1])
      kept[i] = 2
    else
      kept[i] = 3
    end
  else
    local held, acquired, _, holder = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
    if held == token then
      redis.call('SET', key, held .. '|' .. acquired .. '|' .. ARGV[2] .. '|' .. holder,
                 'PX', ARGV[1])
      kept[i] = 1
    end
  end
end
return kept
"""

# KEYS[1] lease key; ARGV[1] token.
_RELEASE = """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
if string.match(value, '^([^|]*)|') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""

# KEYS[1] lease key. Value and remaining time read atomically, in one round trip.
_GET = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
return {value, redis.call('PTTL', KEYS[1])}
"""


def connect_redis(url: str) -> redis.Redis:
    """A client for `url` with short timeouts and a bounded retry, suited to lease heartbeats."""
    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RETRIES),
        health_check_interval=30,
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _from_ms(value: bytes | str) -> datetime:
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeaseBackend(LeaseBackend):
    """Leases on a Redis server; the client is thread-safe, so one instance serves a process."""

    def __init__(self, client: redis.Redis, *, owns_client: bool = False) -> None:
        self._client = client
        self._owns_client = owns_client
        # Registered once: the Script objects run EVALSHA and reload themselves after a restart.
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._get = client.register_script(_GET)
        self._renew_many = client.register_script(_RENEW_MANY)
        self._keep_many = client.register_script(_KEEP_MANY)

    @classmethod
    def from_url(cls, url: str) -> RedisLeaseBackend:
        return cls(connect_redis(url), owns_client=True)

    def acquire(self, name: str, holder: str, ttl_seconds: float) -> str | None:
        check_name(name)
        check_holder(holder)
        ttl_ms = ttl_milliseconds(ttl_seconds)
        token = new_token()
        now = _now_ms()
        value = f"{token}|{now}|{now}|{holder}"
        # GET makes the SET retry-safe: if a first attempt succeeded but its reply was lost, the
        # retry finds our own token instead of reporting the lease as taken by someone else.
        previous = self._call(
            lambda: self._client.set(lease_key(name), value, nx=True, px=ttl_ms, get=True)
        )
        if previous is None or _text(previous).split("|", 1)[0] == token:
            return token
        return None

    def renew(self, name: str, token: str, ttl_seconds: float) -> bool:
        check_name(name)
        ttl_ms = ttl_milliseconds(ttl_seconds)
        result = self._call(
            lambda: self._renew(keys=[lease_key(name)], args=[token, ttl_ms, _now_ms()])
        )
        return bool(result)

    def renew_many(self, held: Sequence[tuple[str, str]], ttl_seconds: float) -> list[bool]:
        """Every renewal in one script call: one round trip, each lease's token compared."""
        for name, _ in held:
            check_name(name)
        if not held:
            return []
        ttl_ms = ttl_milliseconds(ttl_seconds)
        now = _now_ms()
        keys = [lease_key(name) for name, _ in held]
        args: list[str | int] = [ttl_ms, now, *(token for _, token in held)]

        def run() -> list[Any]:
            return list(self._renew_many(keys=keys, args=args))

        return [bool(result) for result in self._call(run)]

    def keep_many(
        self,
        held: Sequence[tuple[str, str, str]],
        ttl_seconds: float,
        *,
        take_back: bool = True,
    ) -> list[Renewal]:
        """Every lease in one script call: renewed, taken back (or, without `take_back`, found
        free) when its key is gone, or refused."""
        for name, _, holder in held:
            check_name(name)
            check_holder(holder)
        if not held:
            return []
        keys = [lease_key(name) for name, _, _ in held]
        args: list[str | int] = [ttl_milliseconds(ttl_seconds), _now_ms(), int(take_back)]
        for _, token, holder in held:
            args += [token, holder]

        def run() -> list[Any]:
            return list(self._keep_many(keys=keys, args=args))

        return [Renewal(int(result)) for result in self._call(run)]

    def get_many(self, names: Sequence[str]) -> list[LeaseInfo | None]:
        for name in names:
            check_name(name)
        if not names:
            return []

        def run() -> list[Any]:
            # MULTI/EXEC: each value and its remaining time are read together, as in `_GET`.
            pipe = self._client.pipeline(transaction=True)
            for name in names:
                pipe.get(lease_key(name))
                pipe.pttl(lease_key(name))
            replies = pipe.execute()
            return [
                [value, remaining] if value is not None else None
                for value, remaining in zip(replies[::2], replies[1::2], strict=True)
            ]

        return [self._info(name, reply) for name, reply in zip(names, self._call(run), strict=True)]

    def release(self, name: str, token: str) -> bool:
        check_name(name)
        # A retry after a lost reply answers False although the first attempt released it; the
        # lease is free either way, which is all a releasing holder needs.
        result = self._call(lambda: self._release(keys=[lease_key(name)], args=[token]))
        return bool(result)

    def get(self, name: str) -> LeaseInfo | None:
        check_name(name)
        return self._info(name, self._call(lambda: self._get(keys=[lease_key(name)])))

    @staticmethod
    def _info(name: str, reply: Any) -> LeaseInfo | None:
        if not reply:
            return None
        raw, remaining_ms = reply
        token, acquired, renewed, holder = _text(raw).split("|", 3)
        # PTTL is the server's own countdown; anchoring it to our clock gives the real deadline.
        expires_at = datetime.now(UTC) + timedelta(milliseconds=max(int(remaining_ms), 0))
        return LeaseInfo(
            name=name,
            holder=holder,
            token=token,
            acquired_at=_from_ms(acquired),
            renewed_at=_from_ms(renewed),
            expires_at=expires_at,
        )

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    @staticmethod
    def _call(operation: Callable[[], T]) -> T:
        try:
            return operation()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise LeaseBackendUnavailable(f"Redis did not answer the lease call: {exc}") from exc
        except (ReadOnlyError, OutOfMemoryError) as exc:
            # A replica after a failover, or a full server: it answers, but takes no lease write.
            raise LeaseBackendUnavailable(f"Redis refused the lease write: {exc}") from exc
