"""Batched lease calls on every back end: one heartbeat renews many leases, one sweep reads many."""

from __future__ import annotations

import time

from orchestrator.leases.base import LeaseBackend
from tests.integration.test_lease_contract import SHORT_TTL, TTL, backend

__all__ = ["backend"]  # the contract's parametrized fixture: Redis, SQLite, Postgres


def test_renew_many_renews_exactly_the_leases_still_held(backend: LeaseBackend) -> None:
    held = []
    for n in range(5):
        token = backend.acquire(f"batch:{n}", f"w{n}", TTL)
        assert token is not None
        held.append((f"batch:{n}", token))
    stolen_name, _ = held[1]
    assert backend.release(*held[1])
    thief = backend.acquire(stolen_name, "thief", TTL)
    assert thief is not None
    short = backend.acquire("batch:short", "w", SHORT_TTL)
    assert short is not None
    time.sleep(SHORT_TTL + 0.2)  # expired: a renewal must not bring it back
    asked = [*held, ("batch:short", short), ("batch:never", "0" * 32)]
    assert backend.renew_many(asked, TTL * 4) == [True, False, True, True, True, False, False]
    info = backend.get(held[0][0])
    assert info is not None
    assert (info.expires_at - info.renewed_at).total_seconds() > TTL * 3
    thief_info = backend.get(stolen_name)
    assert thief_info is not None
    assert thief_info.token == thief  # a refused renewal changed nothing
    assert backend.get("batch:short") is None
    assert backend.renew_many([], TTL) == []


def test_get_many_answers_in_order(backend: LeaseBackend) -> None:
    token = backend.acquire("many:a", "holder-a", TTL)
    assert token is not None
    infos = backend.get_many(["many:missing", "many:a", "many:missing"])
    assert infos[0] is None
    assert infos[2] is None
    assert infos[1] is not None
    assert (infos[1].token, infos[1].holder) == (token, "holder-a")
    assert backend.get_many([]) == []
