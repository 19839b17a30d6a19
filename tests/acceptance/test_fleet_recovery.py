"""Real workers on Redis and Postgres: SIGKILL recovery, duplicate delivery, Redis data loss."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.acceptance.fleet import Fleet, celery_runtime, fleet_env, running_fleet
from tests.executions_support import (
    completing_turns,
    node,
    plan_call,
    runtime_for,
    wait_for,
    write_script,
)
from tests.services import RedisServer
from workers.celery_app import CeleryDispatcher, make_celery

LEASE, SWEEP = 3.0, 1.0


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": str(LEASE),
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": str(SWEEP),
        "ORCH_QUEUED_STALE_SECONDS": "3",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.fixture
def rt(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    settings_overrides: dict[str, Any] = {"redis_url": redis_url}
    runtime, _ = runtime_for(pg_url, scripts, **settings_overrides)
    runtime.dispatcher = CeleryDispatcher(make_celery(runtime.settings))
    yield runtime
    runtime.close()


def execution(rt: Runtime, task_id: str, generation: int) -> Any:
    with rt.db.transaction(readonly=True) as conn:
        return execution_store.get_execution(conn, task_id, generation)


def test_sigkilled_worker_is_replaced_by_generation_two_within_lease_plus_sweep(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=8.0))
    doomed = fleet.worker(concurrency=1)
    fleet.sweeper()
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="kill me")).task.task_id
    wait_for(
        lambda: rt.plans.latest(rt.tasks.get(task_id).session_id or ""),
        30,
        what="generation 1's first plan revision",
    )
    first = execution(rt, task_id, 1)
    standby = fleet.worker(concurrency=1)  # the replacement is up before the kill
    wait_for(lambda: fleet.ready(standby), 30, what="the standby worker")
    Fleet.kill(doomed)
    killed_at = time.monotonic()
    wait_for(
        lambda: (e := execution(rt, task_id, 2)) is not None and e.started_at,
        30,
        interval=0.05,
        what="generation 2 to start",
    )
    recovered_in = time.monotonic() - killed_at
    assert recovered_in <= LEASE + SWEEP + 1, (recovered_in, fleet.logs())
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    view = rt.tasks.explain(task_id)
    assert [e["outcome"] for e in view["executions"]] == ["lost", "completed"]
    # The dead generation's late write is refused, whoever sends it.
    late = plan_call("late", "late", [node("x", "running")])["arguments"]
    with pytest.raises(StaleGeneration):
        rt.plans.publish_execution_plan(
            first.session_id, late, fence=Fence(task_id, 1, first.lease_token)
        )


def test_a_message_delivered_twice_starts_one_agent(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=1.0))
    fleet.worker(concurrency=2)
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="twice")).task.task_id
    rt.dispatcher.dispatch(task_id, 1)  # the broker hands the same wake-up out again
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    time.sleep(1.0)
    view = rt.tasks.explain(task_id)
    assert len(view["executions"]) == 1
    assert view["plan"]["revision"] == 2  # one agent published r1 and r2, nobody else
    logs = fleet.logs()
    assert logs.count("generation 1: every plan node is done") == 1, logs


def test_redis_losing_its_data_mid_round_never_yields_two_live_generations(
    fleet: Fleet, rt: Runtime, scripts: Path, redis_server: RedisServer
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=4.0))
    fleet.worker(concurrency=2)
    fleet.sweeper()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type="slow", title=f"t{n}")).task.task_id for n in range(3)
    ]
    wait_for(
        lambda: any(rt.tasks.get(t).status == "running" for t in task_ids),
        30,
        what="a round to run",
    )
    violations: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for task_id in task_ids:
                with rt.db.transaction(readonly=True) as conn:
                    live = [
                        e.generation
                        for e in execution_store.list_executions(conn, task_id)
                        if e.outcome is None and e.started_at is not None
                    ]
                if len(live) > 1:
                    violations.append(f"{task_id}: live generations {live}")
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        running = [t for t in task_ids if rt.tasks.get(t).status == "running"]
        redis_server.restart()  # every key is gone: leases, queued messages, unacked ones
        wait_for(
            lambda: all(rt.tasks.get(t).status == "completed" for t in task_ids),
            90,
            interval=0.5,
            what="every task to finish after Redis lost its data",
        )
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert violations == []
    for task_id in task_ids:
        outcomes = [e["outcome"] for e in rt.tasks.explain(task_id)["executions"]]
        assert outcomes.count("completed") == 1, outcomes
    # A round in flight took its lease back and went on: no generation was lost to the restart.
    assert running
    for task_id in running:
        assert [e["outcome"] for e in rt.tasks.explain(task_id)["executions"]] == ["completed"]


def test_requeue_of_a_running_task_hands_over_as_soon_as_the_old_generation_lets_go(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=5.0))
    fleet.worker(concurrency=2)  # no sweeper: the hand-over must not depend on republishing
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="requeue me")).task.task_id
    wait_for(lambda: rt.tasks.get(task_id).status == "running", 30, what="generation 1 to run")
    requeued_at = time.monotonic()
    assert rt.tasks.requeue(task_id, "operator wants a fresh look").generation == 2
    wait_for(
        lambda: (e := execution(rt, task_id, 2)) is not None and e.started_at,
        15,
        what="generation 2 to start",
    )
    # The old worker notices at its next renewal (1 s); the wake-up retries after one period.
    assert time.monotonic() - requeued_at <= 4.0, fleet.logs()
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    outcomes = [e["outcome"] for e in rt.tasks.explain(task_id)["executions"]]
    assert outcomes == ["superseded", "completed"]


@pytest.mark.parametrize("marked", [True, False], ids=["sent-again", "unmarked"])
def test_a_duplicate_wake_up_after_redis_lost_its_data_leaves_the_running_round_alone(
    fleet: Fleet, rt: Runtime, scripts: Path, redis_url: str, marked: bool
) -> None:
    """Redis loses every lease; before the running round's heartbeat takes its lease back, a
    second wake-up for the same generation arrives (the sweeper republishing it, a message
    delivered again). Before, that wake-up took the free lease for as long as its claim took;
    the round's renewal in between was refused, and the round stopped and was handed back for
    nothing. The claim is held up here (the tasks table locked against writes) so that the
    heartbeat surely falls in that window; the wake-up must not take a lease the store says a
    live generation holds.

    Unmarked: a trigger whose publish raised though Redis took the message, delivered late as a
    first delivery (the sweeper's republish was the marked copy). It takes the lease before it
    reads the store; the round's refused renewal is then no reason to stop, since the store
    says the generation is live under the round's token: it goes on, and takes the lease back
    once the duplicate gave it back. Before, the round stopped and was handed back."""
    write_script(scripts, "slow", completing_turns(delay_s=3.0))
    worker = fleet.worker(concurrency=2)
    fleet.sweeper()
    wait_for(lambda: fleet.ready(worker), 30, what="the worker")
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="wiped")).task.task_id
    wait_for(
        lambda: rt.plans.latest(rt.tasks.get(task_id).session_id or ""),
        30,
        interval=0.02,
        what="generation 1's first plan revision (the round now waits on its model)",
    )
    # Right after a heartbeat (its mirrored expiry moves), so the next one is a period away.
    mirrored = execution(rt, task_id, 1).lease_expires_at
    wait_for(
        lambda: execution(rt, task_id, 1).lease_expires_at != mirrored,
        5,
        interval=0.01,
        what="a heartbeat",
    )
    mirrored = execution(rt, task_id, 1).lease_expires_at
    with rt.db.engine.connect() as blocker:
        blocker.exec_driver_sql("LOCK TABLE tasks IN EXCLUSIVE MODE")  # reads still pass
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # every lease is gone
        client.close()
        rt.dispatcher.dispatch(task_id, 1, again=marked)  # the sweeper republishing it, or not
        stopped = f"generation 1 of task {task_id} stops:"
        contested = f"generation 1 of task {task_id}: another holder has its lease"
        wait_for(
            lambda: (
                execution(rt, task_id, 1).lease_expires_at != mirrored
                or stopped in fleet.logs()
                or contested in fleet.logs()
            ),
            5,
            interval=0.02,
            what="the round's next heartbeat",
        )
        blocker.rollback()
    wait_for(
        lambda: f"task {task_id} generation 1: task is at generation" in fleet.logs(),
        10,
        what="the duplicate wake-up to be answered",
    )
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    logs = fleet.logs()
    assert stopped not in logs, logs
    assert [e["outcome"] for e in rt.tasks.explain(task_id)["executions"]] == ["completed"]
    # Unmarked, the duplicate held the lease when the heartbeat came (the case this tests).
    assert (contested in logs) is not marked, logs


def test_wake_ups_redis_lost_with_its_data_are_sent_again_at_the_next_sweep(
    pg_url: str, redis_url: str, rt: Runtime, scripts: Path, tmp_path: Path
) -> None:
    """A task triggered while no worker was free has its wake-up in Redis; Redis loses its data.
    Before, the task stayed queued until the sweeper took its wake-up for lost, after
    ORCH_QUEUED_STALE_SECONDS (a minute by default); now the next sweep sees that Redis lost
    its data and sends every queued task's wake-up again."""
    write_script(scripts, "quick", completing_turns())
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": str(LEASE),
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": "0.2",
        "ORCH_QUEUED_STALE_SECONDS": "30",
    }
    swept = tmp_path / "home" / "sweeper.heartbeat"
    with running_fleet(env, tmp_path) as fleet:
        fleet.sweeper()
        wait_for(swept.exists, 30, interval=0.02, what="the first sweep")
        task_id = rt.tasks.trigger(Trigger(task_type="quick", title="wiped")).task.task_id
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # the wake-up goes with the rest
        client.close()
        worker = fleet.worker(concurrency=1)
        wait_for(lambda: fleet.ready(worker), 30, interval=0.02, what="the worker")
        ready_at = time.monotonic()
        wait_for(
            lambda: (e := execution(rt, task_id, 1)) is not None and e.started_at,
            5,
            interval=0.02,
            what="generation 1 to start (it waited for its wake-up)",
        )
        assert time.monotonic() - ready_at < 5
        assert f"republished the wake-up of task {task_id} generation 1" in fleet.logs()


@pytest.mark.parametrize("data", ["kept", "lost"])
def test_a_wake_up_redis_refused_at_the_trigger_goes_out_within_a_sweep_of_its_return(
    pg_url: str, scripts: Path, tmp_path: Path, data: str
) -> None:
    """Redis is down when a task is triggered: the trigger says the wake-up was not sent.
    Redis comes back, with its data or without. Before, the task waited
    ORCH_QUEUED_STALE_SECONDS (a minute by default, 30 s here) unless Redis came back empty;
    now the store recorded the wake-up as unsent and the next sweep sends it."""
    write_script(scripts, "quick", completing_turns())
    own = RedisServer()
    own.start()
    env = fleet_env(pg_url, own.url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": str(LEASE),
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": "0.2",
        "ORCH_QUEUED_STALE_SECONDS": "30",
    }
    swept = tmp_path / "home" / "sweeper.heartbeat"
    try:
        with running_fleet(env, tmp_path) as fleet, celery_runtime(pg_url, own.url, scripts) as rt:
            worker = fleet.worker(concurrency=1)
            fleet.sweeper()
            wait_for(lambda: fleet.ready(worker), 30, interval=0.02, what="the worker")
            wait_for(swept.exists, 30, interval=0.02, what="the first sweep")
            if data == "kept":
                own.pause()
            else:
                own.stop()
            result = rt.tasks.trigger(Trigger(task_type="quick", title="refused"))
            assert not result.dispatched
            assert result.unsent_recorded
            task_id = result.task.task_id
            own.resume() if data == "kept" else own.start()
            back_at = time.monotonic()
            wait_for(
                lambda: (e := execution(rt, task_id, 1)) is not None and e.started_at,
                20,
                interval=0.02,
                what="generation 1 to start (its wake-up waited for the stale republish)",
            )
            # A sweep (0.2 s) and the worker's reconnection to Redis (about 2 s).
            assert time.monotonic() - back_at < 8, fleet.logs()
            assert f"republished the wake-up of task {task_id} generation 1" in fleet.logs()
    finally:
        own.close()
