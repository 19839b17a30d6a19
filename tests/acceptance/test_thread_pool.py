"""One worker process on the threads pool runs many executions at once, every lease kept.

40 rounds that each wait 2 s on the (scripted) model run side by side in one process: they all
complete, in about the time of one, on short leases that only the process's one heartbeat keeps
alive; no generation is lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import tasks as task_store
from tests.acceptance.fleet import Fleet
from tests.executions_support import completing_turns, runtime_for, wait_for, write_script
from workers.celery_app import CeleryDispatcher, make_celery

COUNT, WAIT = 40, 2.0


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_REDIS_URL": redis_url,
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": "2",  # shorter than a round: renewals must land in time
        "ORCH_LEASE_RENEW_SECONDS": "0.5",
        "ORCH_HOME": str(tmp_path / "home"),
    }
    running = Fleet(env, tmp_path)
    yield running
    running.stop()


@pytest.fixture
def rt(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    runtime.dispatcher = CeleryDispatcher(make_celery(runtime.settings))
    yield runtime
    runtime.close()


@pytest.mark.slow
def test_one_process_runs_many_rounds_at_once_without_losing_a_lease(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write_script(scripts, "waits", completing_turns(delay_s=WAIT))
    worker = fleet.worker(COUNT)  # the default pool: threads
    wait_for(lambda: fleet.ready(worker), 60, what="the worker")
    began = time.monotonic()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type="waits", title=f"t{n}")).task.task_id
        for n in range(COUNT)
    ]
    wait_for(
        lambda: all(rt.tasks.get(t).status == "completed" for t in task_ids),
        60,
        interval=0.2,
        what=f"{COUNT} completions\n{fleet.logs()}",
    )
    elapsed = time.monotonic() - began
    assert elapsed < COUNT * WAIT / 4, elapsed  # side by side, not one after another
    with rt.db.transaction(readonly=True) as conn:
        runs = [e for t in task_ids for e in task_store.list_executions(conn, t)]
    assert [e.outcome for e in runs] == ["completed"] * COUNT  # no generation lost
    assert len({e.worker for e in runs}) == 1  # all in the one worker process (host:pid)
    starts = sorted(e.started_at for e in runs if e.started_at is not None)
    assert (starts[-1] - starts[0]).total_seconds() < WAIT  # all running at once
    assert "lease renewal was refused" not in fleet.logs()
