"""An outage is not the task's doing: a generation its worker handed back after the store or
Redis failed under its round is counted in `handbacks` (parked at ORCH_MAX_HANDBACKS), not in
`recoveries` (a worker that died or stalled, parked at ORCH_MAX_RECOVERIES). Before, three
Redis restarts in a row under a task parked it as `recovery_limit`, as three crashes would.
Both stores."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError, OperationalError

from orchestrator import metrics
from orchestrator.api.app import create_app
from orchestrator.cli.task_show import render_explain
from orchestrator.domain.fences import Fence
from orchestrator.runtime import Runtime
from orchestrator.services import executions as executions_module
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.sweeper import LEASE_EXPIRED
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import generations as generation_store
from orchestrator.store import task_events as event_store
from orchestrator.store.lost import HANDED_BACK
from orchestrator.store.types import utcnow
from tests.executions_support import (
    claim_as_worker,
    completing_turns,
    runtime_for,
    simple_task,
    write_script,
)


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[Runtime]:
    rt, _ = runtime_for(
        store_url,
        scripts,
        lease_seconds=120,
        lease_renew_seconds=40,
        max_recoveries=3,
        max_handbacks=5,
    )
    write_script(scripts, "simple", completing_turns())
    yield rt
    rt.close()


def _store_down(*_args: Any, **_kwargs: Any) -> Any:
    raise OperationalError("UPDATE tasks", {}, Exception("server closed the connection"))


def _stopped_by_the_store(rt: Runtime, task_id: str, generation: int) -> None:
    """Run `generation` with the store failing at its decision: the round hands it back."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executions_module, "finish_generation", _store_down)
        result = rt.executions.run(task_id, generation, worker="w1")
    assert (result.ran, result.outcome) == (True, None)


def _crashed(rt: Runtime, task_id: str, generation: int) -> None:
    """Claim `generation` as a worker that then dies: its mirrored lease runs out."""
    token = claim_as_worker(rt, task_id, generation, "w-dead", ttl=120)
    rt.leases.release(f"task:{task_id}", token)
    with rt.db.transaction() as conn:
        assert generation_store.mirror_lease(
            conn, task_id, generation, token, utcnow() - timedelta(seconds=1)
        )


def _counted() -> tuple[float, float]:
    """The process's recoveries and hand-backs so far (the sweeper's metrics)."""
    return metrics.RECOVERIES._value.get(), metrics.HANDBACKS._value.get()


def _task(rt: Runtime, task_id: str) -> Any:
    return rt.tasks.get(task_id)


def test_rounds_stopped_by_outages_outlast_the_crash_budget_and_the_task_runs_on(
    env: Runtime,
) -> None:
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    before = _counted()
    # Four outages in a row: one more than ORCH_MAX_RECOVERIES (3), which used to park the
    # task at the third.
    for generation in range(1, 5):
        _stopped_by_the_store(rt, task_id, generation)
        assert rt.sweeper.sweep().requeued == [(task_id, generation, generation + 1)]
        task = _task(rt, task_id)
        assert (task.status, task.recoveries, task.handbacks) == ("queued", 0, generation)
    # orchestrator_recoveries_total and, of them, orchestrator_handbacks_total.
    assert _counted() == (before[0] + 4, before[1] + 4)
    with rt.db.transaction(readonly=True) as conn:
        first = execution_store.get_execution(conn, task_id, 1)
        events = event_store.events_of_type(conn, task_id, "queued", 10)
    assert first is not None
    assert (first.outcome, first.reason) == ("lost", HANDED_BACK)
    assert first.handed_back_at is not None
    assert first.handed_back_at <= first.ended_at
    assert any(e.reason == f"generation 1: {HANDED_BACK}" for e in events)
    explained = rt.tasks.explain(task_id)
    assert explained["handbacks"] == 4
    assert explained["executions"][0]["handed_back_at"] == first.handed_back_at
    shown = render_explain(explained)  # `orchestrator tasks show`
    assert "lost in a row: 0 by a worker that died or stalled, 4 handed back after an outage" in (
        shown
    )
    assert HANDED_BACK in shown
    # The store is back: the fifth generation runs to its decision (the script's plans re-open
    # the nodes the first generation completed and are refused, so it published none and
    # continues), and a round that ended resets both counts.
    ended = rt.executions.run(task_id, 5, worker="w1")
    assert ended.outcome == "continue"
    assert ended.detail.startswith("the round published no plan of its own")
    task = _task(rt, task_id)
    assert (task.status, task.generation, task.recoveries, task.handbacks) == ("queued", 6, 0, 0)


def test_outages_in_a_row_park_the_task_at_their_own_limit(env: Runtime) -> None:
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    for generation in range(1, 5):
        _stopped_by_the_store(rt, task_id, generation)
        assert rt.sweeper.sweep().requeued
    _stopped_by_the_store(rt, task_id, 5)
    report = rt.sweeper.sweep()
    assert (report.requeued, report.parked) == ([], [(task_id, 5)])
    task = _task(rt, task_id)
    assert (task.status, task.failure_code) == ("failed", "recovery_limit")
    assert task.last_error == (
        "5 generations in a row were handed back by their workers (the "
        "store, Redis or the model server was away; each execution says which)"
    )
    assert (task.recoveries, task.handbacks) == (0, 5)
    with rt.db.transaction(readonly=True) as conn:
        [failed] = event_store.events_of_type(conn, task_id, "failed", 10)
    assert failed.reason == f"recovery_limit: generation 5: {HANDED_BACK}"
    # What the API sends (its response models validate them).
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        body = client.get(f"/api/v1/tasks/{task_id}").json()
        listed = client.get("/api/v1/tasks").json()["items"]
    assert (body["recoveries"], body["handbacks"]) == (0, 5)
    assert all(ex["handed_back_at"] for ex in body["executions"])
    assert [(t["task_id"], t["handbacks"]) for t in listed] == [(task_id, 5)]


def test_a_worker_that_died_still_counts_against_the_crash_budget(env: Runtime) -> None:
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    before = _counted()
    _crashed(rt, task_id, 1)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    _stopped_by_the_store(rt, task_id, 2)  # an outage in between counts apart
    assert rt.sweeper.sweep().requeued == [(task_id, 2, 3)]
    _crashed(rt, task_id, 3)
    assert rt.sweeper.sweep().requeued == [(task_id, 3, 4)]
    task = _task(rt, task_id)
    assert (task.status, task.recoveries, task.handbacks) == ("queued", 2, 1)
    assert _counted() == (before[0] + 3, before[1] + 1)
    with rt.db.transaction(readonly=True) as conn:
        crashed = execution_store.get_execution(conn, task_id, 1)
    assert crashed is not None
    assert (crashed.reason, crashed.handed_back_at) == (LEASE_EXPIRED, None)
    _crashed(rt, task_id, 4)  # the third crash in a row parks it, as before
    assert rt.sweeper.sweep().parked == [(task_id, 4)]
    task = _task(rt, task_id)
    assert (task.status, task.failure_code) == ("failed", "recovery_limit")
    assert task.last_error == "3 generations in a row lost their lease"
    assert (task.recoveries, task.handbacks) == (3, 1)


def test_an_operator_requeue_resets_both_counts(env: Runtime) -> None:
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    _stopped_by_the_store(rt, task_id, 1)
    rt.sweeper.sweep()
    _crashed(rt, task_id, 2)
    rt.sweeper.sweep()
    assert (_task(rt, task_id).recoveries, _task(rt, task_id).handbacks) == (1, 1)
    rt.tasks.requeue(task_id, reason="try again")
    task = _task(rt, task_id)
    assert (task.status, task.recoveries, task.handbacks) == ("queued", 0, 0)


def test_a_hand_back_with_another_token_marks_nothing(env: Runtime) -> None:
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "w1", ttl=120)
    assert rt.executions.handback.give_back(Fence(task_id, 1, "b" * 32))
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.handed_back_at is None
    assert execution.lease_expires_at > utcnow()
    assert rt.executions.handback.give_back(Fence(task_id, 1, token))
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.handed_back_at is not None


def test_a_worker_that_stalled_past_its_lease_counts_as_lost_not_as_an_outage(
    store_url: str, scripts: Path
) -> None:
    # The whole process stalls past its lease (a pause, a frozen VM) just before its decision:
    # its heartbeat does not renew either. On waking, the round sees its lease ran out while
    # the lease back end answered and hands the generation back; that is a worker lost, as the
    # sweep would have counted it had it come first, not an outage.
    rt, _ = runtime_for(
        store_url, scripts, lease_seconds=1.0, lease_renew_seconds=0.5, max_handbacks=5
    )
    try:
        task_id = simple_task(rt, scripts)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(LeaseKeeper, "start", lambda self: None)  # the heartbeat stalls too

            def stalled(self: Any, session_id: str) -> int:
                time.sleep(1.1)
                return 0

            patch.setattr(executions_module.ExecutionService, "_background_still_running", stalled)
            result = rt.executions.run(task_id, 1, worker="w1")
        assert (result.ran, result.outcome) == (True, None)
        assert "stopped before its decision" in result.detail
        with rt.db.transaction(readonly=True) as conn:
            execution = execution_store.get_execution(conn, task_id, 1)
        assert execution is not None
        assert execution.handed_back_at is None
        assert execution.lease_expires_at <= utcnow()  # still given back at once
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
        task = _task(rt, task_id)
        assert (task.status, task.recoveries, task.handbacks) == ("queued", 1, 0)
        with rt.db.transaction(readonly=True) as conn:
            lost = execution_store.get_execution(conn, task_id, 1)
        assert lost is not None
        assert lost.reason == LEASE_EXPIRED
    finally:
        rt.close()


def test_a_statement_the_store_refuses_is_no_outage_and_parks_at_the_crash_budget(
    env: Runtime,
) -> None:
    # The store answered and refused the round's statement (a constraint, a value, a column
    # the schema lacks): the same round meets it again, so it is not an outage's doing and
    # does not get ten tries of the outage budget, only the three of a lost worker.
    rt = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise IntegrityError("INSERT INTO reports", {}, Exception("duplicate key value"))

    for generation in range(1, 4):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(executions_module, "finish_generation", refused)
            result = rt.executions.run(task_id, generation, worker="w1")
        assert (result.ran, result.outcome) == (True, None)  # left to recovery, as before
        with rt.db.transaction(readonly=True) as conn:
            execution = execution_store.get_execution(conn, task_id, generation)
        assert execution is not None
        assert execution.handed_back_at is None
        assert execution.lease_expires_at <= utcnow()  # still given back at once
        rt.sweeper.sweep()
    task = _task(rt, task_id)
    assert (task.status, task.failure_code) == ("failed", "recovery_limit")
    assert (task.recoveries, task.handbacks) == (3, 0)
