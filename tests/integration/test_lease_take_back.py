"""A lease taken back (it vanished, or ran out while nobody took it) never outlives the
generation the store says is over, and never costs a generation the store said was live.

The keeper takes a free lease back before it asks the store (the mirror) whether its generation
is live. Two races follow from that order, both tested here on both stores, with the SQL and
the Redis lease back ends:

- a worker that stalled past its lease while the sweeper requeued its generation wakes up and
  re-creates the lease: the store refuses the mirror, and the lease must go at once, or the next
  generation's wake-up finds it held and comes back only after ORCH_LEASE_RENEW_SECONDS (and,
  if the stalled round is slow to end, the new generation waits out a whole lease);
- the sweeper read the mirror expired and the lease absent, then the keeper took the lease back
  and mirrored it before the sweeper's requeue committed: the requeue must see the fresh mirror
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
from orchestrator.runtime import Runtime
from orchestrator.services import lease_keeper as lease_keeper_module
from orchestrator.services.executions import RunResult
from orchestrator.services.lease_keeper import Heartbeat, LeaseKeeper, lease_name
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
    assert rt.leases.get(lease_name(task_id)) is None
    assert rt.leases.acquire(lease_name(task_id), "w2", TTL) is not None
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


def _live(rt: Runtime) -> tuple[str, LeaseKeeper]:
    """A claimed generation 1, held, whose lease then vanished (Redis lost its data)."""
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "w1", 30)
    keeper = LeaseKeeper(
        rt.leases, rt.db, Fence(task_id, 1, token), holder="w1", ttl=30, renew_every=10
    )
    assert rt.leases.release(lease_name(task_id), token)
    return task_id, keeper


def _store_away(*_args: object, **_kwargs: object) -> object:
    raise OperationalError("UPDATE executions", {}, Exception("server closed the connection"))


@pytest.mark.parametrize("then", ["cancelled", "live"])
def test_a_take_back_the_store_could_not_confirm_is_settled_by_its_next_mirror(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    task_id, keeper = _live(rt)
    taken_back = metrics.LEASES_TAKEN_BACK._value.get()
    with monkeypatch.context() as away:
        away.setattr(lease_keeper_module, "mirror_leases", _store_away)
        Heartbeat._beat([keeper])  # taken back; the mirror fails: nobody confirmed it
    assert not keeper.lost.is_set()
    assert rt.leases.get(lease_name(task_id)) is not None
    assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back
    if then == "cancelled":
        rt.tasks.cancel(task_id)
        Heartbeat._beat([keeper])  # renewed now, and the store says the generation is over
        assert keeper.lost.is_set()
        # The lease it re-created for an ended generation goes at once, as in the same beat.
        assert rt.leases.get(lease_name(task_id)) is None
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back
    else:
        Heartbeat._beat([keeper])
        assert not keeper.lost.is_set()
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1  # confirmed now
        Heartbeat._beat([keeper])
        assert metrics.LEASES_TAKEN_BACK._value.get() == taken_back + 1  # once


def test_a_wake_up_that_meets_a_take_back_waits_only_for_its_release(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Generation 2's wake-up arrives between the stalled worker's take-back and its release
    (the mirror held up here: the executions table locked against writes). Before, it found
    the lease held and came back after a second (Celery's first retry), and after
    ORCH_LEASE_RENEW_SECONDS if the lease was still held then; now it waits for the release."""
    rt, _ = runtime_for(pg_url, tmp_path, redis_url=redis_url)
    try:
        write_script(tmp_path, "simple", completing_turns())
        task_id, keeper = _stalled(rt)
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
        refused = threading.Event()
        real_acquire = rt.leases.acquire

        def acquire(name: str, holder: str, ttl_seconds: float) -> str | None:
            token = real_acquire(name, holder, ttl_seconds)
            if token is None:
                refused.set()
            return token

        rt.leases.acquire = acquire  # type: ignore[method-assign]
        results: list[RunResult] = []
        with rt.db.engine.connect() as blocker:
            blocker.exec_driver_sql("LOCK TABLE executions IN EXCLUSIVE MODE")  # reads pass
            beat = threading.Thread(target=Heartbeat._beat, args=([keeper],))
            beat.start()
            wait_for(
                lambda: rt.leases.get(lease_name(task_id)) is not None,
                5,
                interval=0.005,
                what="the stalled worker to take its lease back",
            )
            wake = threading.Thread(
                target=lambda: results.append(rt.executions.run(task_id, 2, worker="w2"))
            )
            wake.start()
            assert refused.wait(5), "the wake-up did not meet the taken-back lease"
            released_at = utcnow()
            blocker.rollback()  # the mirror answers (generation 1 is over) and the lease goes
        beat.join(10)
        wake.join(30)
        [result] = results
        assert keeper.lost.is_set()
        assert result.ran, result.detail
        assert result.retry_after is None
        with rt.db.transaction(readonly=True) as conn:
            second = execution_store.get_execution(conn, task_id, 2)
        assert second is not None
        assert second.started_at is not None
        assert rt.tasks.get(task_id).status == "completed"
        del rt.leases.acquire
        # Claimed as soon as the lease was let go, not a second (a Celery retry) later.
        assert (second.started_at - released_at).total_seconds() < 0.5
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
    from orchestrator.store import generations as generation_store

    rt, _ = runtime_for(store_url, tmp_path)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="twice")).task.task_id
        token = rt.leases.acquire(lease_name(task_id), "first", 30)  # the first wake-up's
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
            assert generation_store.claim_generation(
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
