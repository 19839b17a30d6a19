"""A sweep's batch of wake-ups (`CeleryDispatcher.dispatch_many`) reaches a real worker: every
task in the batch runs, once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import completing_turns, wait_for, write_script
from workers.celery_app import CeleryDispatcher

COUNT = 30


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = {**fleet_env(pg_url, redis_url, tmp_path), "ORCH_MODEL": f"scripted:{scripts}"}
    with running_fleet(env, tmp_path) as running:
        yield running


def test_every_wakeup_of_a_batch_runs_its_task_once(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "batched", completing_turns())
    celery_dispatcher = rt.dispatcher
    assert isinstance(celery_dispatcher, CeleryDispatcher)
    rt.dispatcher = RecordingDispatcher()  # queued, not woken: the batch below wakes them
    rt.__dict__.pop("tasks", None)
    task_ids = [
        rt.tasks.trigger(Trigger(task_type="batched", title=f"b{n}")).task.task_id
        for n in range(COUNT)
    ]
    worker = fleet.worker(4)
    wait_for(lambda: fleet.ready(worker), 60, what="the worker")
    celery_dispatcher.dispatch_many([(task_id, 1) for task_id in task_ids])
    wait_for(
        lambda: all(rt.tasks.get(t).status == "completed" for t in task_ids),
        60,
        interval=0.2,
        what=f"{COUNT} completions\n{fleet.logs()}",
    )
    with rt.db.transaction(readonly=True) as conn:
        runs = [e for t in task_ids for e in execution_store.list_executions(conn, t)]
    assert [(e.generation, e.outcome) for e in runs] == [(1, "completed")] * COUNT
