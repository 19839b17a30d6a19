"""`orchestrator sweeper` through a Redis outage, as a real process: one warning when Redis
stops answering, none at the sweeps after, one line when it answers again, and the work it
could not do done then.

Before, an expired generation made every sweep of the outage log `sweep failed
(SweepDeferred: the lease back end is unavailable ...); retrying in 0.3s`, and nothing said
when Redis was back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import claim_as_worker, runtime_for, wait_for
from tests.services import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

SWEEP = 0.3


@pytest.fixture
def fleet(pg_url: str, redis_of_its_own: RedisServer, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_of_its_own.url, tmp_path) | {"ORCH_SWEEP_SECONDS": str(SWEEP)}
    with running_fleet(env, tmp_path) as running:
        yield running


def test_the_sweeper_says_an_outage_once_and_when_redis_is_back(
    fleet: Fleet, pg_url: str, redis_of_its_own: RedisServer, tmp_path: Path
) -> None:
    rt, _ = runtime_for(pg_url, tmp_path, redis_url=redis_of_its_own.url)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="held")).task.task_id
        claim_as_worker(rt, task_id, 1, "a worker that dies", 1.0)  # expired in a second
    finally:
        rt.close()
    redis_of_its_own.stop()
    time.sleep(1.0)  # its lease's end: expired at the first sweep
    fleet.sweeper()
    log = fleet.folder / "sweeper-0.log"
    wait_for(lambda: "does not answer" in log.read_text(), 30, what="the outage's line")
    time.sleep(10 * SWEEP)  # ten sweeps more of the same outage
    during = log.read_text()
    assert during.count("does not answer") == 1, fleet.logs()
    assert "sweep failed" not in during, fleet.logs()
    [line] = [line for line in during.splitlines() if "does not answer" in line]
    assert "1 expired generation(s) not checked" in line
    assert f"tries again at every sweep (every {SWEEP:g}s)" in line

    redis_of_its_own.start()
    wait_for(lambda: "answers again after" in log.read_text(), 30, what="the line of its return")
    wait_for(lambda: f"requeued task {task_id}" in log.read_text(), 30, what="the requeue")
    assert log.read_text().count("does not answer") == 1, fleet.logs()
