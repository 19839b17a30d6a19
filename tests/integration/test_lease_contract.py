"""One contract for both lease back ends: Redis, and the SQL store on SQLite and on Postgres."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
import redis

from orchestrator.leases.base import LeaseBackend, LeaseBackendUnavailable
from orchestrator.leases.keys import lease_key
from orchestrator.leases.redis import RedisLeaseBackend
from orchestrator.leases.sql import SqlLeaseBackend
from orchestrator.store.db import Database
from tests.services import RedisServer, refused_port

# Short enough to keep the suite quick, long enough that a busy two-core machine does not let a
# lease run out between two calls that expect it held.
TTL = 1.5
SHORT_TTL = 0.3
CLOCK_SLACK = timedelta(seconds=1)

T = TypeVar("T")


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("sql-sqlite"),
        pytest.param("sql-postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[LeaseBackend]:
    database: Database | None = None
    lease_backend: LeaseBackend
    if request.param == "redis":
        lease_backend = RedisLeaseBackend.from_url(request.getfixturevalue("redis_url"))
    else:
        fixture = "sqlite_url" if request.param == "sql-sqlite" else "pg_url"
        database = Database.from_url(request.getfixturevalue(fixture))
        lease_backend = SqlLeaseBackend(database)
    yield lease_backend
    lease_backend.close()
    if database is not None:
        database.dispose()


def _race(backend: LeaseBackend, name: str, threads: int = 16) -> list[str | None]:
    """`threads` holders call acquire at the same instant; returns what each got."""
    return at_once(threads, lambda index: backend.acquire(name, f"worker-{index}", TTL))


def at_once(threads: int, attempt: Callable[[int], T]) -> list[T]:
    """`attempt(index)` on `threads` threads released at the same instant; what each returned."""
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads
    errors: list[BaseException] = []

    def take(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = attempt(index)
        except BaseException as exc:  # surfaced below, a thread cannot fail the test itself
            errors.append(exc)

    workers = [threading.Thread(target=take, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not errors, errors
    return results


def test_acquire_is_exclusive(backend: LeaseBackend) -> None:
    token = backend.acquire("task:a", "worker-1", TTL)
    assert token
    assert backend.acquire("task:a", "worker-2", TTL) is None
    assert backend.acquire("task:a", "worker-1", TTL) is None  # not re-entrant either
    other = backend.acquire("task:b", "worker-2", TTL)
    assert other
    assert other != token


def test_each_acquire_returns_a_fresh_token(backend: LeaseBackend) -> None:
    first = backend.acquire("task:a", "worker-1", TTL)
    assert first
    assert backend.release("task:a", first)
    second = backend.acquire("task:a", "worker-1", TTL)
    assert second
    assert second != first
    assert not backend.renew("task:a", first, TTL)


def test_renew_extends_the_lease(backend: LeaseBackend) -> None:
    token = backend.acquire("task:a", "worker-1", SHORT_TTL * 2)
    assert token
    before = backend.get("task:a")
    assert before
    time.sleep(SHORT_TTL)
    assert backend.renew("task:a", token, TTL)
    after = backend.get("task:a")
    assert after
    assert after.token == token
    assert after.expires_at > before.expires_at
    assert after.renewed_at > before.renewed_at
    assert after.acquired_at == before.acquired_at
    time.sleep(SHORT_TTL * 2)  # past the first deadline: only the renewal keeps it held
    assert backend.get("task:a") is not None
    assert backend.acquire("task:a", "worker-2", TTL) is None
    assert backend.renew("task:a", token, TTL)


def test_renew_with_a_wrong_token_fails_and_changes_nothing(backend: LeaseBackend) -> None:
    token = backend.acquire("task:a", "worker-1", TTL)
    assert token
    before = backend.get("task:a")
    assert not backend.renew("task:a", "0" * 32, 60)
    assert not backend.renew("task:missing", token, 60)
    after = backend.get("task:a")
    assert before
    assert after
    assert after.token == token
    assert after.renewed_at == before.renewed_at
    assert after.expires_at <= before.expires_at + timedelta(milliseconds=50)


def test_renew_after_expiry_fails(backend: LeaseBackend) -> None:
    token = backend.acquire("task:a", "worker-1", SHORT_TTL)
    assert token
    time.sleep(SHORT_TTL + 0.3)
    assert not backend.renew("task:a", token, TTL)  # nobody took it, and still too late
    assert backend.get("task:a") is None


def test_release_with_a_wrong_token_does_nothing(backend: LeaseBackend) -> None:
    token = backend.acquire("task:a", "worker-1", TTL)
    assert token
    assert not backend.release("task:a", "0" * 32)
    assert not backend.release("task:missing", token)
    held = backend.get("task:a")
    assert held
    assert held.token == token
    assert backend.acquire("task:a", "worker-2", TTL) is None
    assert backend.release("task:a", token)
    assert backend.get("task:a") is None
    assert not backend.release("task:a", token)  # twice is a no-op


def test_expiry_frees_the_lease_for_another_holder(backend: LeaseBackend) -> None:
    stale = backend.acquire("task:a", "worker-1", SHORT_TTL)
    assert stale
    time.sleep(SHORT_TTL + 0.3)
    fresh = backend.acquire("task:a", "worker-2", TTL)
    assert fresh
    assert fresh != stale
    held = backend.get("task:a")
    assert held
    assert held.holder == "worker-2"
    # The stalled first holder wakes up: it can neither extend nor drop the new holder's lease.
    assert not backend.renew("task:a", stale, TTL)
    assert not backend.release("task:a", stale)
    held = backend.get("task:a")
    assert held
    assert held.token == fresh


def test_sixteen_racing_holders_get_exactly_one_token(backend: LeaseBackend) -> None:
    for round_number in range(3):
        results = _race(backend, f"task:race-{round_number}")
        tokens = [token for token in results if token is not None]
        assert len(tokens) == 1, results
        held = backend.get(f"task:race-{round_number}")
        assert held
        assert held.token == tokens[0]


def test_racing_over_an_expired_lease_gives_exactly_one_token(backend: LeaseBackend) -> None:
    assert backend.acquire("task:a", "crashed-worker", SHORT_TTL)
    time.sleep(SHORT_TTL + 0.3)
    results = _race(backend, "task:a")
    tokens = [token for token in results if token is not None]
    assert len(tokens) == 1, results


def test_get_reports_every_field(backend: LeaseBackend) -> None:
    assert backend.get("task:a") is None
    started = datetime.now(UTC)
    token = backend.acquire("task:a", "host-1:4242", TTL)
    assert token
    info = backend.get("task:a")
    assert info
    assert (info.name, info.holder, info.token) == ("task:a", "host-1:4242", token)
    for stamp in (info.acquired_at, info.renewed_at, info.expires_at):
        assert stamp.tzinfo is not None
        assert stamp.utcoffset() == timedelta(0)
    assert info.acquired_at == info.renewed_at
    assert abs(info.acquired_at - started) < CLOCK_SLACK
    lifetime = info.expires_at - info.acquired_at
    assert timedelta(seconds=TTL) - CLOCK_SLACK < lifetime <= timedelta(seconds=TTL) + CLOCK_SLACK


def test_holder_may_contain_separators(backend: LeaseBackend) -> None:
    holder = "celery@host|pid=7|gen:2"
    token = backend.acquire("task:a", holder, TTL)
    assert token
    assert backend.renew("task:a", token, TTL)
    info = backend.get("task:a")
    assert info
    assert info.holder == holder


def test_bad_arguments_are_refused(backend: LeaseBackend) -> None:
    with pytest.raises(ValueError, match="TTL"):
        backend.acquire("task:a", "worker-1", 0)
    with pytest.raises(ValueError, match="name"):
        backend.acquire("", "worker-1", TTL)
    with pytest.raises(ValueError, match="holder"):
        backend.acquire("task:a", "x" * 256, TTL)
    assert backend.get("task:a") is None


# Redis only: the lease lives in Redis alone, so Redis losing its data must end it.


@pytest.mark.redis
def test_redis_flushall_ends_the_lease(redis_url: str) -> None:
    backend = RedisLeaseBackend.from_url(redis_url)
    try:
        token = backend.acquire("task:a", "worker-1", TTL)
        assert token
        client = redis.Redis.from_url(redis_url)
        assert client.exists(lease_key("task:a"))
        client.flushall()
        client.close()
        assert not backend.renew("task:a", token, TTL)
        assert backend.get("task:a") is None
        fresh = backend.acquire("task:a", "worker-2", TTL)
        assert fresh
        assert fresh != token
    finally:
        backend.close()


@pytest.mark.redis
def test_redis_restart_ends_the_lease_and_the_client_recovers(
    redis_url: str, redis_server: RedisServer
) -> None:
    backend = RedisLeaseBackend.from_url(redis_url)
    try:
        token = backend.acquire("task:a", "worker-1", TTL)
        assert token
        redis_server.restart()  # empty again, scripts forgotten, pooled connections dead
        assert not backend.renew("task:a", token, TTL)
        fresh = backend.acquire("task:a", "worker-2", TTL)
        assert fresh
        assert backend.release("task:a", fresh)
    finally:
        backend.close()


@pytest.mark.redis
def test_redis_unreachable_is_reported_as_unavailable() -> None:
    backend = RedisLeaseBackend.from_url(f"redis://127.0.0.1:{refused_port()}/0")
    try:
        started = time.monotonic()
        with pytest.raises(LeaseBackendUnavailable):
            backend.acquire("task:a", "worker-1", TTL)
        with pytest.raises(LeaseBackendUnavailable):
            backend.renew("task:a", "0" * 32, TTL)
        # Bounded retries: a heartbeat learns of the outage in well under one renew interval.
        assert time.monotonic() - started < 5
    finally:
        backend.close()
