"""A generation's first wake-up takes the lease before it reads the store; a wake-up that may
be a duplicate (retried, delivered again, republished) reads the store first.

The store read keeps a duplicate away from the lease of a round whose lease Redis lost
(tests/acceptance/test_fleet_recovery.py); it cost every start 0.6 ms of latency and a commit,
though only a wake-up sent again can find its generation claimed by another.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import event

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services import executions as executions_module
from orchestrator.services.lease_keeper import Heartbeat, LeaseKeeper
from orchestrator.settings import load_settings
from orchestrator.store import driver
from orchestrator.store import executions as execution_store
from tests.executions_support import claim_as_worker, runtime_for, simple_task
from workers.celery_app import CeleryDispatcher, make_celery
from workers.constants import QUEUE, SENT_AGAIN


@pytest.fixture(params=["sql", "redis"])
def rt(request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    extra = {}
    if request.param == "redis":
        extra["redis_url"] = request.getfixturevalue("redis_url")
    runtime, _ = runtime_for(store_url, tmp_path, **extra)
    yield runtime
    runtime.close()


def _statements_before_the_lease(
    rt: Runtime, run: Any, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The statements `run()` sent to the store before it first asked for the lease: through
    SQLAlchemy, or in autocommit on the driver's kept connections (Postgres)."""
    sent: list[str] = []
    asked: list[bool] = []
    real_acquire = rt.leases.acquire

    def acquire(name: str, holder: str, ttl_seconds: float) -> str | None:
        asked.append(True)
        return real_acquire(name, holder, ttl_seconds)

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not asked:
            sent.append(statement)

    real_rows = driver.rows

    def rows(engine: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if not asked:
            sent.append(str(statement))
        return real_rows(engine, statement, *args, **kwargs)

    monkeypatch.setattr(driver, "rows", rows)
    rt.leases.acquire = acquire  # type: ignore[method-assign]
    event.listen(rt.db.engine, "before_cursor_execute", on_statement)
    try:
        run()
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", on_statement)
        del rt.leases.acquire
        monkeypatch.undo()
    assert asked, "the wake-up never asked for the lease"
    return sent


def test_a_first_delivery_takes_the_lease_before_any_statement(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = simple_task(rt, tmp_path)
    results = []
    sent = _statements_before_the_lease(
        rt,
        lambda: results.append(rt.executions.run(task_id, 1, worker="w", first_delivery=True)),
        monkeypatch,
    )
    assert sent == []
    assert (results[0].ran, results[0].outcome) == (True, "completed")


def test_a_wake_up_that_may_be_a_duplicate_reads_the_store_first(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = simple_task(rt, tmp_path)
    results = []
    sent = _statements_before_the_lease(
        rt, lambda: results.append(rt.executions.run(task_id, 1, worker="w")), monkeypatch
    )
    assert any("FROM tasks" in statement for statement in sent), sent
    assert (results[0].ran, results[0].outcome) == (True, "completed")


def test_a_duplicate_leaves_a_running_rounds_free_lease_alone(rt: Runtime, tmp_path: Path) -> None:
    """The round's lease is gone (Redis lost its data): a wake-up sent again does not take it."""
    task_id = simple_task(rt, tmp_path)
    token = claim_as_worker(rt, task_id, 1, "first", 30)
    assert rt.leases.release(task_lease(task_id), token)  # as a wiped Redis would leave it
    asked: list[str] = []
    real_acquire = rt.leases.acquire

    def acquire(name: str, holder: str, ttl_seconds: float) -> str | None:
        asked.append(holder)
        return real_acquire(name, holder, ttl_seconds)

    rt.leases.acquire = acquire  # type: ignore[method-assign]
    try:
        result = rt.executions.run(task_id, 1, worker="second")
    finally:
        del rt.leases.acquire
    assert not result.ran
    assert result.detail == "task is at generation 1 (running)"
    assert asked == []


def test_a_first_delivery_that_finds_its_generation_claimed_gives_the_lease_back(
    rt: Runtime, tmp_path: Path
) -> None:
    """Lease first, then the compare-and-set claim: a first delivery whose generation another
    wake-up claimed (it cannot happen unless a wake-up was sent again unmarked) starts nothing
    and leaves the lease free, as before the store read was added."""
    task_id = simple_task(rt, tmp_path)
    token = claim_as_worker(rt, task_id, 1, "first", 30)
    assert rt.leases.release(task_lease(task_id), token)
    result = rt.executions.run(task_id, 1, worker="second", first_delivery=True)
    assert not result.ran
    assert result.detail == "task is at generation 1 (running)"
    # Given back: a fresh holder takes it at once.
    assert rt.leases.acquire(task_lease(task_id), "third", 30) is not None
    assert rt.tasks.get(task_id).status == "running"


def test_an_unmarked_duplicate_that_takes_a_running_rounds_free_lease_does_not_stop_it(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake-up sent again that nothing marked so (a trigger's publish raised though Redis took
    the message; the sweeper's republish was the marked one) arrives as a first delivery after
    Redis lost its data: it takes the running round's free lease, then its claim finds the
    generation running and gives the lease back. The round's heartbeat falls in between.
    Before, that renewal was refused and the round stopped (handed back for nothing); now the
    store says the generation is live under the round's token, so the round goes on and takes
    its lease back at the next beat."""
    task_id = simple_task(rt, tmp_path)
    token = claim_as_worker(rt, task_id, 1, "first", 30)
    keeper = LeaseKeeper(
        rt.leases, rt.db, Fence(task_id, 1, token), holder="first", ttl=30, renew_every=10
    )
    assert rt.leases.release(task_lease(task_id), token)  # as a wiped Redis would leave it
    real_claim = executions_module.claim_store.claim_generation_alone
    held_by: list[str | None] = []

    def claim(*args: Any, **kwargs: Any) -> Any:
        holder = rt.leases.get(task_lease(task_id))
        held_by.append(None if holder is None else holder.holder)
        Heartbeat._beat([keeper])  # the round's heartbeat, while the duplicate claims
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(executions_module.claim_store, "claim_generation_alone", claim)
    result = rt.executions.run(task_id, 1, worker="duplicate", first_delivery=True)
    monkeypatch.undo()
    assert held_by == ["duplicate"]  # the duplicate held the lease when the heartbeat came
    assert not result.ran
    assert not keeper.lost.is_set(), keeper.lost.why
    keeper.check()
    Heartbeat._beat([keeper])  # the next beat: the lease is free again, and taken back
    assert not keeper.lost.is_set(), keeper.lost.why
    held = rt.leases.get(task_lease(task_id))
    assert held is not None
    assert (held.token, held.holder) == (token, "first")
    assert rt.tasks.get(task_id).status == "running"
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.outcome is None
    assert execution.handed_back_at is None


def test_a_wake_up_sent_again_carries_the_header_a_first_one_does_not(
    redis_url: str, tmp_path: Path
) -> None:
    dispatcher = CeleryDispatcher(make_celery(load_settings(home=tmp_path, redis_url=redis_url)))
    client = redis.Redis.from_url(redis_url)
    client.delete(QUEUE)
    dispatcher.dispatch("t-1", 1)
    dispatcher.dispatch("t-1", 1, again=True)
    first, again = (json.loads(raw)["headers"] for raw in client.lrange(QUEUE, 0, -1)[::-1])
    client.delete(QUEUE)
    assert SENT_AGAIN not in first
    assert again[SENT_AGAIN] is True
