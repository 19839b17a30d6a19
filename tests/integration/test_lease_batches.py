"""Batched lease calls on every back end: one heartbeat renews many leases, one sweep reads many."""

from __future__ import annotations

import time

from orchestrator.leases.base import LeaseBackend, Renewal
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


def test_keep_many_renews_takes_back_a_free_lease_and_refuses_a_taken_one(
    backend: LeaseBackend,
) -> None:
    held = []
    for n in range(4):
        token = backend.acquire(f"keep:{n}", f"w{n}", TTL)
        assert token is not None
        held.append((f"keep:{n}", token, f"w{n}"))
    # keep:1 released (as gone with Redis's data) and keep:2 taken by another holder since.
    assert backend.release(*held[1][:2])
    assert backend.release(*held[2][:2])
    thief = backend.acquire("keep:2", "thief", TTL)
    assert thief is not None
    # keep:3 ran out while nobody took it (its holder stalled past the TTL).
    short = backend.acquire("keep:short", "w-short", SHORT_TTL)
    assert short is not None
    time.sleep(SHORT_TTL + 0.2)
    asked = [*held, ("keep:short", short, "w-short")]
    assert backend.keep_many(asked, TTL * 4) == [
        Renewal.RENEWED,
        Renewal.TAKEN_BACK,
        Renewal.REFUSED,
        Renewal.RENEWED,
        Renewal.TAKEN_BACK,
    ]
    for name, token, holder in [held[1], ("keep:short", short, "w-short")]:
        info = backend.get(name)
        assert info is not None
        assert (info.token, info.holder) == (token, holder)  # its own token, held again
        assert (info.expires_at - info.renewed_at).total_seconds() > TTL * 3
    taken = backend.get("keep:2")
    assert taken is not None
    assert taken.token == thief  # a refusal changed nothing
    # Taken back, it is held: another holder cannot take it, its token renews and releases it.
    assert backend.acquire("keep:1", "other", TTL) is None
    assert backend.keep_many([held[1]], TTL) == [Renewal.RENEWED]
    assert backend.release(*held[1][:2])
    assert backend.keep_many([], TTL) == []
