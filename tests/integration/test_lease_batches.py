"""Batched lease calls on every back end: one heartbeat renews many leases, one sweep reads many."""

from __future__ import annotations

import time

from orchestrator.leases.base import LeaseBackend, Renewal
from tests.integration.test_lease_contract import SHORT_TTL, TTL, at_once, backend

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


def test_keep_many_without_take_back_finds_a_free_lease_and_leaves_it_free(
    backend: LeaseBackend,
) -> None:
    """What a generation's heartbeat asks first: a free lease is taken back only once the
    store said its generation is live (services/lease_keeper.py)."""
    held = []
    for n in range(3):
        token = backend.acquire(f"find:{n}", f"w{n}", TTL)
        assert token is not None
        held.append((f"find:{n}", token, f"w{n}"))
    assert backend.release(*held[1][:2])  # gone with Redis's data
    assert backend.release(*held[2][:2])
    thief = backend.acquire("find:2", "thief", TTL)
    assert thief is not None
    short = backend.acquire("find:short", "w-short", SHORT_TTL)
    assert short is not None
    time.sleep(SHORT_TTL + 0.2)  # ran out while nobody took it
    asked = [*held, ("find:short", short, "w-short")]
    assert backend.keep_many(asked, TTL * 4, take_back=False) == [
        Renewal.RENEWED,
        Renewal.FREE,
        Renewal.REFUSED,
        Renewal.FREE,
    ]
    assert backend.get("find:1") is None  # left free
    assert backend.get("find:short") is None
    taken = backend.get("find:2")
    assert taken is not None
    assert taken.token == thief
    # Then taken back with its own token, as the keeper does once the store agreed.
    assert backend.keep_many([held[1]], TTL) == [Renewal.TAKEN_BACK]
    info = backend.get("find:1")
    assert info is not None
    assert (info.token, info.holder) == (held[1][1], "w1")


def _take_back_race(backend: LeaseBackend, name: str) -> list[str]:
    """8 holders take `name` back (each its own token) while 8 wake-ups acquire it, at once:
    the tokens that ended up holding it."""

    def take(i: int) -> str | None:
        if i % 2:
            token = f"{i:032x}"
            [answer] = backend.keep_many([(name, token, f"keeper-{i}")], TTL)
            assert answer is not Renewal.RENEWED
            return token if answer is Renewal.TAKEN_BACK else None
        return backend.acquire(name, f"waker-{i}", TTL)

    return [got for got in at_once(16, take) if got is not None]


def test_a_take_back_racing_acquires_leaves_one_holder(backend: LeaseBackend) -> None:
    # Redis lost its data (the lease exists nowhere), or the lease ran out while nobody took it:
    # of the holders taking it back (a stalled old generation, the current one) and the
    # wake-ups acquiring it, exactly one holds it.
    old = backend.acquire("race:ran-out", "old", SHORT_TTL)
    assert old is not None
    time.sleep(SHORT_TTL + 0.2)
    for name in ("race:gone", "race:ran-out"):
        won = _take_back_race(backend, name)
        assert len(won) == 1, won
        info = backend.get(name)
        assert info is not None
        assert info.token == won[0]


def test_keep_many_with_one_name_twice_takes_back_the_first_and_refuses_the_second(
    backend: LeaseBackend,
) -> None:
    # Two generations of one task in one process's batch (the old one not yet stopped) after
    # Redis lost its data: the same answer on every back end, in the order given.
    first, second = "a" * 32, "b" * 32
    assert backend.keep_many([("twice:x", first, "old"), ("twice:x", second, "new")], TTL) == [
        Renewal.TAKEN_BACK,
        Renewal.REFUSED,
    ]
    info = backend.get("twice:x")
    assert info is not None
    assert (info.token, info.holder) == (first, "old")
    assert backend.keep_many([("twice:x", second, "new"), ("twice:x", first, "old")], TTL) == [
        Renewal.REFUSED,
        Renewal.RENEWED,
    ]
