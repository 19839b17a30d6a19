"""A cancel or a requeue stops a round at once on its worker, even while the round waits on the
model: not at the lease's next renewal (here 20 s away)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import completing_turns, wait_for, write_script

THINKING = 30.0  # the model's first turn: the round waits on it when the operator acts
RENEW = 20.0


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = {
        **fleet_env(pg_url, redis_url, tmp_path),
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": "60",
        "ORCH_LEASE_RENEW_SECONDS": str(RENEW),
    }
    with running_fleet(env, tmp_path) as running:
        yield running


def stop_line(task_id: str, act: str) -> str:
    """The worker's line when the round stops, saying why (a cancel is not a lost lease)."""
    why = "the task was cancelled" if act == "cancel" else "the generation was superseded"
    return f"generation 1 of task {task_id} stops: {why}"


def generation_2_started(rt: Runtime, task_id: str) -> bool:
    with rt.db.transaction(readonly=True) as conn:
        runs = execution_store.list_executions(conn, task_id)
    return any(e.generation == 2 and e.started_at is not None for e in runs)


@pytest.mark.parametrize("act", ["cancel", "requeue"])
def test_the_worker_stops_the_round_at_once(
    fleet: Fleet, rt: Runtime, scripts: Path, act: str
) -> None:
    turns = completing_turns()
    turns[0] = {**turns[0], "delay_s": THINKING}
    write_script(scripts, "slow", turns)
    write_script(scripts, "quick", completing_turns())
    worker = fleet.worker(1)
    wait_for(lambda: fleet.ready(worker), 60, what="the worker")
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="waits on the model")).task.task_id
    wait_for(lambda: rt.tasks.get(task_id).status == "running", 30, what="the round to start")
    time.sleep(1.0)  # the round is waiting on the model's first turn
    acted = time.monotonic()
    if act == "cancel":
        rt.tasks.cancel(task_id, "wrong site")
    else:
        rt.tasks.requeue(task_id, "a second look")
    wait_for(
        lambda: stop_line(task_id, act) in fleet.logs(),
        RENEW / 2,
        interval=0.1,
        what=f"the worker to stop the round\n{fleet.logs()}",
    )
    assert time.monotonic() - acted < 5
    # The worker's one slot is free again at once, not after the model's 30 s: it runs the
    # requeued generation, or another task after a cancel.
    if act == "requeue":
        wait_for(lambda: generation_2_started(rt, task_id), RENEW / 2, what="generation 2")
    else:
        other = rt.tasks.trigger(Trigger(task_type="quick", title="next")).task.task_id
        wait_for(lambda: rt.tasks.get(other).status == "completed", RENEW / 2, what="next task")
