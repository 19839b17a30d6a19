"""Lease pieces without a server: TTL rounding, argument limits, key names, back end choice."""

from __future__ import annotations

import math

import pytest

from orchestrator.leases import make_lease_backend
from orchestrator.leases.base import (
    MAX_HOLDER,
    MAX_NAME,
    check_holder,
    check_name,
    new_token,
    ttl_milliseconds,
)
from orchestrator.leases.keys import PREFIX, lease_key, lease_name
from orchestrator.leases.redis import RedisLeaseBackend
from orchestrator.leases.sql import SqlLeaseBackend
from orchestrator.settings import Settings
from orchestrator.store.db import Database


def test_ttl_rounds_up_to_whole_milliseconds() -> None:
    assert ttl_milliseconds(120) == 120_000
    assert ttl_milliseconds(0.0001) == 1  # never 0, which Redis would refuse or treat as none
    assert ttl_milliseconds(1.0005) == 1001


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan])
def test_ttl_must_be_positive_and_finite(ttl: float) -> None:
    with pytest.raises(ValueError, match="TTL"):
        ttl_milliseconds(ttl)


def test_names_and_holders_fit_both_back_ends() -> None:
    check_name("task:" + "a" * (MAX_NAME - 5))
    check_holder("h" * MAX_HOLDER)
    for bad in ("", "n" * (MAX_NAME + 1)):
        with pytest.raises(ValueError, match="name"):
            check_name(bad)
    with pytest.raises(ValueError, match="holder"):
        check_holder("h" * (MAX_HOLDER + 1))


def test_tokens_are_random_hex_without_separators() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(token) == 32 and int(token, 16) >= 0 for token in tokens)


def test_every_lease_key_sits_under_the_prefix() -> None:
    assert PREFIX == "orch:"
    assert lease_key("task:abc") == "orch:lease:task:abc"
    assert lease_name(b"orch:lease:task:abc") == "task:abc"
    with pytest.raises(ValueError, match="lease key"):
        lease_name("other:task:abc")


def test_redis_url_chooses_redis_leases() -> None:
    database = Database.from_url("sqlite://")
    settings = Settings(redis_url="redis://127.0.0.1:1/0", database_url=None)
    backend = make_lease_backend(settings, database)  # redis-py connects lazily: no I/O here
    try:
        assert isinstance(backend, RedisLeaseBackend)
    finally:
        backend.close()
        database.dispose()


def test_no_redis_chooses_sql_leases_on_the_store() -> None:
    database = Database.from_url("sqlite://")
    backend = make_lease_backend(Settings(redis_url=None, database_url=None), database)
    try:
        assert isinstance(backend, SqlLeaseBackend)
    finally:
        backend.close()
        database.dispose()
