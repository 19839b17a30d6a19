"""A cold shutdown (Ctrl+C twice, or SIGQUIT) of a threads-pool worker hands its rounds back.

Celery cannot kill a thread: on a cold shutdown its main thread leaves while the rounds still
run, and Python then refuses every new job to a thread pool. A round that went on did not stop:
its next tool call or transcript write raised `cannot schedule new futures after shutdown` and
its task was parked `failed` for good, a task lost to a stop the operator asked for. Now the
rounds stop first and give their generations back: the sweep requeues them, and another worker
finishes the task.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import completing_turns, wait_for, write_script

#: A cold shutdown is meant to be quick: the rounds stop, hand back, and the process exits.
EXIT_WITHIN_SECONDS = 15.0


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_SWEEP_SECONDS": "1",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.mark.slow
@pytest.mark.parametrize("signals", [(signal.SIGINT, signal.SIGINT), (signal.SIGQUIT,)])
def test_a_cold_shutdown_hands_running_rounds_back_instead_of_failing_them(
    fleet: Fleet, rt: Runtime, scripts: Path, signals: tuple[signal.Signals, ...]
) -> None:
    # The model thinks for 30 s in the middle of the round: the stop comes while it waits.
    write_script(scripts, "slow", completing_turns(delay_s=30.0))
    doomed = fleet.worker(2, "--name", "doomed@%h")
    fleet.sweeper()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type="slow", title=f"cold {n}")).task.task_id
        for n in range(2)
    ]
    wait_for(
        lambda: all(rt.plans.latest(rt.tasks.get(t).session_id or "") for t in task_ids),
        60,
        what="both rounds' first plan revisions",
    )
    started = time.monotonic()
    for number, signum in enumerate(signals):
        doomed.send_signal(signum)
        if number + 1 < len(signals):
            # Celery takes the second Ctrl+C as a cold shutdown once the first was handled.
            wait_for(lambda: "Warm shutdown" in fleet.logs(), 10, what="the first Ctrl+C's answer")
    try:
        doomed.wait(timeout=EXIT_WITHIN_SECONDS + 15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit after a cold shutdown:\n{fleet.logs()}")
    took = time.monotonic() - started
    logs = fleet.logs()

    for task_id in task_ids:
        task = rt.tasks.get(task_id)
        assert task.status != "failed", (task.last_error, logs)
    assert took < EXIT_WITHIN_SECONDS, logs
    assert "cannot schedule new futures" not in logs
    assert "Traceback" not in logs
    assert "handing their generations back" in logs
    if signals[0] == signal.SIGINT:  # the first Ctrl+C, a warm shutdown, says what it waits for
        assert "warm shutdown: waiting for 2 running round(s) to end" in logs

    # The sweep requeues the handed-back generations; a new worker finishes the tasks.
    for task_id in task_ids:
        wait_for(lambda t=task_id: rt.tasks.get(t).generation == 2, 15, what="the requeue")
        with rt.db.transaction(readonly=True) as conn:
            first = execution_store.get_execution(conn, task_id, 1)
        assert first is not None
        assert first.outcome == "lost", first
    write_script(scripts, "slow", completing_turns())
    fleet.worker(2, "--name", "next@%h")
    for task_id in task_ids:
        wait_for(lambda t=task_id: rt.tasks.get(t).status == "completed", 60, what="the completion")


@pytest.mark.slow
def test_a_cold_shutdown_of_a_solo_worker_hands_its_round_back(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    """The solo pool's round runs on the main thread, which the cold shutdown interrupts: Celery's
    `kill_job` raised into the round and failed its task."""
    write_script(scripts, "slow", completing_turns(delay_s=30.0))
    doomed = fleet.worker(1, "--pool", "solo", "--name", "solo@%h")
    fleet.sweeper()
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="solo")).task.task_id
    wait_for(lambda: rt.plans.latest(rt.tasks.get(task_id).session_id or ""), 60, what="a plan")
    started = time.monotonic()
    doomed.send_signal(signal.SIGQUIT)
    try:
        doomed.wait(timeout=EXIT_WITHIN_SECONDS + 15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit after a cold shutdown:\n{fleet.logs()}")
    logs = fleet.logs()
    task = rt.tasks.get(task_id)
    assert task.status != "failed", (task.last_error, logs)
    assert time.monotonic() - started < EXIT_WITHIN_SECONDS, logs
    assert "kill_job" not in logs
    wait_for(lambda: rt.tasks.get(task_id).generation == 2, 15, what="the requeue")
