"""A worker SIGKILLed mid-round and restarted under another name: generation 2 starts at once.

The default 120 s lease is left as it is and no sweeper runs: only the new worker's start
(which finds that the process holding generation 1 on this host is gone) can requeue it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import (
    completing_turns,
    node,
    plan_call,
    wait_for,
    write_script,
)

#: The goal: generation 2 starts at most this long after the new worker is ready.
GOAL_SECONDS = 2.0


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.mark.slow
def test_a_restarted_worker_requeues_the_dead_generation_at_once(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=3.0))
    doomed = fleet.worker(1, "--name", "first@%h")
    task_id = rt.tasks.trigger(Trigger(task_type="slow", title="kill me")).task.task_id
    wait_for(
        lambda: rt.plans.latest(rt.tasks.get(task_id).session_id or ""),
        60,
        what="generation 1's first plan revision",
    )
    with rt.db.transaction(readonly=True) as conn:
        first = execution_store.get_execution(conn, task_id, 1)
    assert first is not None
    assert first.lease_expires_at is not None
    assert first.started_at is not None
    # The default 120 s lease: waiting it out would fail the goal.
    assert (first.lease_expires_at - first.started_at).total_seconds() > 100
    Fleet.kill(doomed)
    successor = fleet.worker(1, "--name", "second@%h")
    wait_for(lambda: fleet.ready(successor), 60, interval=0.02, what="the new worker")
    ready_at = datetime.now(UTC)

    def second_started() -> datetime | None:
        with rt.db.transaction(readonly=True) as conn:
            second = execution_store.get_execution(conn, task_id, 2)
        return second.started_at if second is not None else None

    started_at = wait_for(second_started, 30, interval=0.05, what="generation 2 to start")
    delay = (started_at - ready_at).total_seconds()
    print(f"generation 2 started {delay:.3f} s after the new worker was ready")
    assert delay <= GOAL_SECONDS, (delay, fleet.logs())
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 60, what="completion")
    view = rt.tasks.explain(task_id)
    assert [e["outcome"] for e in view["executions"]] == ["lost", "completed"]
    assert "worker process is gone" in view["executions"][0]["reason"]
    # Fenced as usual: the dead generation's late write is refused.
    late = plan_call("late", "late", [node("x", "running")])["arguments"]
    with pytest.raises(StaleGeneration):
        rt.plans.publish_execution_plan(
            first.session_id, late, fence=Fence(task_id, 1, first.lease_token)
        )
