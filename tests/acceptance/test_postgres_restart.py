"""A fleet through a Postgres restart: every task completes, nothing is stored twice.

Two workers and a sweeper run rounds with the default two-minute lease; the store restarts
while they are in flight. Rounds that lose the store stop and hand their generations back
(`services/handback.py`), so they are requeued at the next sweep, not a lease later, and the
next ones complete: every task ends well within the lease. The round's statements go to
psycopg past SQLAlchemy (`store.driver`), on the pool's connections and on the driver's own
cache: both must come back from a restarted server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import completing_turns, wait_for, write_script
from tests.services import PostgresServer

TASKS = 30
#: The default lease: a round the restart stopped used to wait it out before its requeue.
LEASE = 120


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": str(LEASE),
        # A claim the restart failed is tried again after 1 s, then every renewal period.
        "ORCH_LEASE_RENEW_SECONDS": "10",
        "ORCH_SWEEP_SECONDS": "1",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.mark.slow
def test_every_task_completes_through_a_postgres_restart_and_nothing_is_stored_twice(
    fleet: Fleet, rt: Runtime, scripts: Path, postgres: PostgresServer
) -> None:
    write_script(scripts, "work", completing_turns(delay_s=0.4))
    workers = [fleet.worker(3), fleet.worker(3)]
    fleet.sweeper()
    wait_for(lambda: all(fleet.ready(worker) for worker in workers), 60, what="the workers")
    ids = [
        rt.tasks.trigger(Trigger(task_type="work", title=f"t{n}")).task.task_id
        for n in range(TASKS)
    ]
    wait_for(lambda: _count(rt, "SELECT count(*) FROM plan_revisions") > 0, 60, what="a plan")
    postgres.restart()  # with rounds in flight: the first plans are out, most rounds are not done
    restarted = time.monotonic()

    def all_ended() -> bool:
        try:
            return all(rt.tasks.get(task_id).status in ("completed", "failed") for task_id in ids)
        except Exception:  # the test's own pool meeting the restart: ask again
            return False

    wait_for(all_ended, LEASE / 2, what="every task to end, well within a lease", interval=1)
    print(f"every task ended {time.monotonic() - restarted:.1f} s after the restart")
    assert [rt.tasks.get(task_id).status for task_id in ids] == ["completed"] * TASKS
    with rt.db.transaction(readonly=True) as conn:
        twice = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM (SELECT session_id, seq FROM transcript_entries "
                "GROUP BY 1, 2 HAVING count(*) > 1) s), "
                "(SELECT count(*) FROM (SELECT session_id, request_id FROM plan_revisions "
                "GROUP BY 1, 2 HAVING count(*) > 1) r), "
                "(SELECT count(*) FROM (SELECT task_id, generation FROM reports "
                "WHERE outcome = 'completed' GROUP BY 1, 2 HAVING count(*) > 1) p)"
            )
        ).one()
    assert tuple(twice) == (0, 0, 0)
    # The restart did hit rounds in flight: some generations were lost and run again.
    assert _count(rt, "SELECT count(*) FROM executions WHERE outcome = 'lost'") >= 1
    logs = fleet.logs()
    assert "Traceback" not in logs
    assert "CRITICAL" not in logs
    # One line per failure: not the driver's hint and SQLAlchemy's link on lines of their own.
    for path in fleet.folder.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            assert not line.startswith(("\t", "(Background on this error")), (path.name, line)


def _count(rt: Runtime, query: str) -> int:
    with rt.db.transaction(readonly=True) as conn:
        return int(conn.execute(text(query)).scalar_one())
