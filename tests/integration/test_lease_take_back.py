"""A lease taken back (it vanished, or ran out while nobody took it) is taken back only for a
generation the store says is live, and never costs a generation the store said was live.

The keeper finds a free lease, leaves it free, asks the store (the fenced mirror) whether its
generation is live, and only then takes the lease back. Tested here on both stores, with the
SQL and the Redis lease back ends:

- a worker that stalled past its lease while the sweeper requeued its generation wakes up and
  finds the lease free: the store refuses the mirror, and the lease is never written, so the
  next generation's renewal (or wake-up) in that moment is not refused. Before, it re-created
  the lease first and released it once the store said no; a renewal of the live next generation
  in between was refused, which stopped that round;
- the sweeper read the mirror expired and the lease absent, then the keeper mirrored and took
  the lease back before the sweeper's requeue committed: the requeue must see the fresh mirror
  and leave the generation alone (the store decides, once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator import metrics
from orchestrator.domain.fences import Fence
from orchestrator.leases import Renewal
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services import lease_keeper as lease_keeper_module
from orchestrator.services.executions import RunResult
from orchestrator.services.lease_keeper import Heartbeat, LeaseKeeper
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store.types import utcnow
from tests.executions_support import (
    claim_as_worker,
    completing_turns,
    runtime_for,
    wait_for,
    write_script,
)

TTL = 0.5


@pytest.fixture(params=["sql", "redis"])
def rt(request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    extra = {}
    if request.param == "redis":
        extra["redis_url"] = request.getfixturevalue("redis_url")
    runtime, _ = runtime_for(store_url, tmp_path, **extra)
    yield runtime
    runtime.close()


def _stalled(rt: Runtime) -> tuple[str, LeaseKeeper]:
    """A claimed generation 1 whose worker stalled past its lease (never renewed)."""
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "w1", TTL)
    keeper = LeaseKeeper(
        rt.leases, rt.db, Fence(task_id, 1, token), holder="w1", ttl=TTL, renew_every=TTL / 4
    )
    time.sleep(TTL + 0.2)
    return task_id, keeper


@pytest.mark.parametrize("how", ["write", "heartbeat"])
def test_a_lease_taken_back_by_a_generation_that_is_over_is_given_back_at_once(
    rt: Runtime, how: str
) -> None:
    task_id, keeper = _stalled(rt)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    taken_back = metrics.LEASES_TAKEN_BACK._value.get()
    # The stalled worker wakes up: its lease is free, it takes it back, the store says no.
    if how == "write":
        assert keeper.renew_now() is False
    else:
        Heartbeat._beat([keeper])
    assert keeper.lost.is_set()
    assert "requeued" in (keeper.lost.why or "")
    # Before: the lease stayed held by generation 1's token until its round closed (or a whole
    # lease later), and generation 2's wake-up came back after ORCH_LEASE_RENEW_SECONDS.
    assert rt.leases.get(task_lease(task_id)) is None
    assert rt.leases.acquire(task_lease(task_id), "w2", TTL) is not None
    # Not counted as a lease a live generation took back: the store said it was over.
    assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back


@pytest.mark.parametrize("how", ["write", "heartbeat"])
def test_a_take_back_mirrored_before_the_sweepers_requeue_keeps_its_generation(
    rt: Runtime, how: str
) -> None:
    task_id, keeper = _stalled(rt)
    taken_back = metrics.LEASES_TAKEN_BACK._value.get()
    # The sweeper reads the store (mirror expired) and the lease back end (nothing held)...
    real_get_many = rt.leases.get_many

    def then_the_keeper_takes_it_back(names: list[str]) -> list[object]:
        answer = real_get_many(names)
        assert answer == [None]
        if how == "write":
            assert keeper.renew_now() is True  # taken back, and the store said live
        else:
            Heartbeat._beat([keeper])
        assert not keeper.lost.is_set()
        return answer  # type: ignore[return-value]

    rt.sweeper.leases.get_many = then_the_keeper_takes_it_back  # type: ignore[method-assign]
    try:
        report = rt.sweeper.sweep()
    finally:
        del rt.sweeper.leases.get_many
    # ...and its requeue, a compare-and-set, sees the mirror the keeper wrote since.
    assert report.requeued == []
    assert not keeper.lost.is_set()
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.outcome is None
    assert rt.tasks.get(task_id).generation == 1
    assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1
    assert keeper.renew_now() is True
    assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1  # renewed, not taken back


@pytest.mark.parametrize("how", ["write", "heartbeat"])
def test_a_stalled_generation_never_holds_the_lease_of_the_live_next_one(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Generation 1 stalled and was requeued; generation 2 runs; Redis loses its data; then
    generation 1's keeper wakes first and finds the lease free. Generation 2's heartbeat falls
    while generation 1 waits for the store's answer. Before, generation 1 had already taken the
    lease back with its token, so that renewal was refused and generation 2, live, stopped
    (handed back for nothing). Now generation 1 asks the store first and never writes the
    lease: generation 2 takes it back and goes on."""
    task_id, stalled = _stalled(rt)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    token = claim_as_worker(rt, task_id, 2, "w2", 30)
    live = LeaseKeeper(
        rt.leases, rt.db, Fence(task_id, 2, token), holder="w2", ttl=30, renew_every=10
    )
    assert rt.leases.release(task_lease(task_id), token)  # Redis restarted empty
    real_keep_many = rt.leases.keep_many
    beats: list[str | None] = []

    def keep_many(held: list[tuple[str, str, str]], ttl: float, **how: bool) -> list[Renewal]:
        answer = real_keep_many(held, ttl, **how)
        if [h[1] for h in held] == [stalled.fence.lease_token] and not beats:
            # Generation 2's heartbeat, while generation 1 goes on to ask the store.
            holder = rt.leases.get(task_lease(task_id))
            beats.append(None if holder is None else holder.token)
            Heartbeat._beat([live])
        return answer

    monkeypatch.setattr(rt.leases, "keep_many", keep_many)
    if how == "write":
        assert stalled.renew_now() is False
    else:
        Heartbeat._beat([stalled])
    assert not live.lost.is_set(), live.lost.why
    assert beats == [None]  # generation 1 wrote nothing to the lease back end before the store
    assert stalled.lost.is_set()
    assert "requeued" in (stalled.lost.why or "")
    held = rt.leases.get(task_lease(task_id))
    assert held is not None
    assert held.token == token  # generation 2 took its lease back
    assert live.renew_now() is True
    assert rt.tasks.get(task_id).status == "running"


def _live(rt: Runtime) -> tuple[str, LeaseKeeper]:
    """A claimed generation 1, held, whose lease then vanished (Redis lost its data)."""
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "w1", 30)
    keeper = LeaseKeeper(
        rt.leases, rt.db, Fence(task_id, 1, token), holder="w1", ttl=30, renew_every=10
    )
    assert rt.leases.release(task_lease(task_id), token)
    return task_id, keeper


def _store_away(*_args: object, **_kwargs: object) -> object:
    raise OperationalError("UPDATE executions", {}, Exception("server closed the connection"))


@pytest.mark.parametrize("then", ["cancelled", "live"])
def test_a_free_lease_the_store_could_not_confirm_is_left_free_until_its_next_mirror(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    task_id, keeper = _live(rt)
    taken_back = metrics.LEASES_TAKEN_BACK._value.get()
    with monkeypatch.context() as away:
        away.setattr(lease_keeper_module, "mirror_leases", _store_away)
        Heartbeat._beat([keeper])  # found free; the mirror fails: nobody said it is live
    assert not keeper.lost.is_set()
    assert rt.leases.get(task_lease(task_id)) is None  # not taken back without the store
    assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back
    if then == "cancelled":
        rt.tasks.cancel(task_id)
        Heartbeat._beat([keeper])  # the store answers: the generation is over
        assert keeper.lost.is_set()
        assert rt.leases.get(task_lease(task_id)) is None  # never held again
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back
    else:
        Heartbeat._beat([keeper])
        assert not keeper.lost.is_set()
        held = rt.leases.get(task_lease(task_id))
        assert held is not None
        assert held.token == keeper.fence.lease_token  # taken back once the store said live
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1
        Heartbeat._beat([keeper])
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1  # once


def test_the_next_generations_wake_up_finds_the_lease_free_while_a_stalled_one_asks_the_store(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Generation 2's wake-up arrives while the stalled worker of generation 1, which found
    its lease free after Redis lost its data, waits for the store's answer (its mirror held up
    here: the executions table locked against writes). Before, generation 1 had taken the
    lease back by then, and the wake-up found it held and waited for its release; now the
    stalled worker writes nothing to Redis before the store says, and the wake-up takes it."""
    rt, _ = runtime_for(pg_url, tmp_path, redis_url=redis_url)
    try:
        write_script(tmp_path, "simple", completing_turns())
        task_id, keeper = _stalled(rt)
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
        mirroring = threading.Event()
        real_mirror = lease_keeper_module.mirror_leases

        def mirror(*args: object, **kwargs: object) -> object:
            mirroring.set()
            return real_mirror(*args, **kwargs)  # type: ignore[arg-type]

        lease_keeper_module.mirror_leases = mirror  # type: ignore[assignment]
        acquired: list[str | None] = []
        real_acquire = rt.leases.acquire

        def acquire(name: str, holder: str, ttl_seconds: float) -> str | None:
            token = real_acquire(name, holder, ttl_seconds)
            acquired.append(token)
            return token

        rt.leases.acquire = acquire  # type: ignore[method-assign]
        results: list[RunResult] = []
        try:
            with rt.db.engine.connect() as blocker:
                blocker.exec_driver_sql("LOCK TABLE executions IN EXCLUSIVE MODE")  # reads pass
                beat = threading.Thread(target=Heartbeat._beat, args=([keeper],))
                beat.start()
                assert mirroring.wait(5), "the stalled worker did not ask the store"
                wake = threading.Thread(
                    target=lambda: results.append(rt.executions.run(task_id, 2, worker="w2"))
                )
                wake.start()
                wait_for(lambda: acquired, 5, interval=0.005, what="the wake-up's lease")
                assert acquired[0] is not None  # free: the stalled worker never took it
                blocker.rollback()  # the store answers: generation 1 is over
            beat.join(10)
            wake.join(30)
        finally:
            lease_keeper_module.mirror_leases = real_mirror
            del rt.leases.acquire
        [result] = results
        assert keeper.lost.is_set()
        assert result.ran, result.detail
        assert rt.tasks.get(task_id).status == "completed"
    finally:
        rt.close()


def test_a_duplicate_wake_up_stops_waiting_once_its_generation_is_claimed(
    store_url: str, tmp_path: Path
) -> None:
    """Two wake-ups of one queued generation (delivered twice, or republished after Redis lost
    its data): the second reads the store before the first claims, then finds the lease
    held. It tried the lease every 10 ms for the whole 0.5 s, holding a worker thread, though
    the first had claimed the generation and keeps the lease for its round; now it reads the
    store again as it waits, and stops within a few tries of the claim."""
    from orchestrator.store import generation_claims as claim_store

    rt, _ = runtime_for(store_url, tmp_path)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="twice")).task.task_id
        token = rt.leases.acquire(task_lease(task_id), "first", 30)  # the first wake-up's
        assert token is not None
        refused = threading.Event()
        claimed = threading.Event()
        after_claim: list[str] = []
        real_acquire = rt.leases.acquire

        def acquire(name: str, holder: str, ttl_seconds: float) -> str | None:
            if claimed.is_set():
                after_claim.append(holder)
            found = real_acquire(name, holder, ttl_seconds)
            refused.set()
            return found

        rt.leases.acquire = acquire  # type: ignore[method-assign]
        results: list[RunResult] = []
        second = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="second"))
        )
        second.start()
        assert refused.wait(5), "the second wake-up did not meet the first's lease"
        with rt.db.transaction() as conn:  # the first claims, and keeps the lease
            assert claim_store.claim_generation(
                conn,
                task_id,
                1,
                lease_token=token,
                worker="first",
                celery_task_id=None,
                lease_expires_at=utcnow() + timedelta(seconds=30),
            )
        claimed.set()
        second.join(5)
        del rt.leases.acquire
        [result] = results
        assert not result.ran
        assert result.detail == "task is at generation 1 (running)"
        assert len(after_claim) <= 5  # RELEASE_RECHECK_POLLS; before, the rest of the 0.5 s
    finally:
        rt.close()
