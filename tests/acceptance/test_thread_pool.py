"""One worker process on the threads pool runs many executions at once, every lease kept.

40 rounds that each wait 2 s on the (scripted) model run side by side in one process: they all
complete, in about the time of one, on short leases that only the process's one heartbeat keeps
alive; no generation is lost. The same holds on the real model client (`openai:`) against the
loopback OpenAI-compatible server answering every turn after 1 s.
"""

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
from tests.openai_server import OpenAIServer, replies

COUNT, WAIT = 40, 2.0
TURN = 1.0  # the OpenAI-compatible server's answer time
#: What the worker logs when a generation stops because its lease is in doubt.
LATE = ("lease renewal was refused", "older than the lease minus its safety margin")


def whole_logs(fleet: Fleet) -> str:
    """Every line the fleet's processes wrote (`Fleet.logs()` keeps only each log's tail)."""
    return "".join(path.read_text(errors="replace") for path in fleet.folder.glob("*.log"))


def lease_env(pg_url: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    return fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_LEASE_SECONDS": "2",  # shorter than a round: renewals must land in time
        "ORCH_LEASE_RENEW_SECONDS": "0.5",
    }


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = {**lease_env(pg_url, redis_url, tmp_path), "ORCH_MODEL": f"scripted:{scripts}"}
    with running_fleet(env, tmp_path) as running:
        yield running


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
        runs = [e for t in task_ids for e in execution_store.list_executions(conn, t)]
    assert [e.outcome for e in runs] == ["completed"] * COUNT  # no generation lost
    assert len({e.worker for e in runs}) == 1  # all in the one worker process (host:pid)
    starts = sorted(e.started_at for e in runs if e.started_at is not None)
    assert (starts[-1] - starts[0]).total_seconds() < WAIT  # all running at once
    logs = whole_logs(fleet)
    for line in LATE:
        assert line not in logs


@pytest.fixture
def model() -> Iterator[OpenAIServer]:
    with OpenAIServer(delay_s=TURN) as running:
        running.converse(replies(completing_turns()))
        yield running


@pytest.fixture
def openai_fleet(
    pg_url: str, redis_url: str, tmp_path: Path, model: OpenAIServer
) -> Iterator[Fleet]:
    env = {
        **lease_env(pg_url, redis_url, tmp_path),
        "ORCH_MODEL": "openai:test-model",
        "LLM_BASE_URL": model.base_url,
        # The 2 s lease of `lease_env`, shorter than a round: each model call (1 s) is awaited
        # while the heartbeat renews the lease, not cut where the lease stood when it began.
        "ORCH_SWEEP_SECONDS": "1",
    }
    with running_fleet(env, tmp_path) as running:
        running.sweeper()  # a lease renewed late would be taken and its generation requeued
        yield running


@pytest.mark.slow
def test_one_process_runs_many_rounds_at_once_on_the_openai_client_without_a_late_renewal(
    openai_fleet: Fleet, rt: Runtime, model: OpenAIServer
) -> None:
    turns = len(completing_turns())
    worker = openai_fleet.worker(COUNT)  # the default pool: threads
    wait_for(lambda: openai_fleet.ready(worker), 60, what="the worker")
    began = time.monotonic()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type="talks", title=f"t{n}")).task.task_id
        for n in range(COUNT)
    ]
    wait_for(
        lambda: all(rt.tasks.get(t).status in ("completed", "failed") for t in task_ids),
        40,
        interval=0.2,
        what=f"{COUNT} rounds to end\n{openai_fleet.logs()[-4000:]}",
    )
    elapsed = time.monotonic() - began
    logs = whole_logs(openai_fleet)
    ended = [rt.tasks.get(t) for t in task_ids]
    failures = [(t.failure_code, t.last_error) for t in ended if t.status != "completed"]
    warnings = [line for line in logs.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not failures, (failures, warnings[:20])
    with rt.db.transaction(readonly=True) as conn:
        runs = [e for t in task_ids for e in execution_store.list_executions(conn, t)]
    assert [(e.generation, e.outcome) for e in runs] == [(1, "completed")] * COUNT  # none lost
    assert len({e.worker for e in runs}) == 1  # all in the one worker process (host:pid)
    starts = sorted(e.started_at for e in runs if e.started_at is not None)
    assert (starts[-1] - starts[0]).total_seconds() < TURN * turns  # all running at once
    assert elapsed < COUNT * TURN * turns / 4, elapsed  # side by side, not one after another
    assert len(model.bodies) == COUNT * turns  # every turn of every round answered, once
    for line in LATE:
        assert line not in logs
