"""`orchestrator recover` during and right after a Postgres outage, as an operator runs it.

While the store is down the sweep cannot read anything: `recover` must not print "nothing to
recover" and exit 0 (a script would take that for "all is well"), nor a traceback; it says in
one line that it could not reach the store and exits 1, with `--json` too (stdout empty). Once
the store is back, the same command requeues the generation whose lease ran out meanwhile.

A Postgres server of the test's own, really stopped (fast shutdown) and started again on its
port with its data; leases in Redis (the session's), or in the store when no Redis is set.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services.tasks import Trigger
from orchestrator.store.migrations import upgrade
from tests.acceptance.fleet import ORCHESTRATOR
from tests.executions_support import claim_as_worker, runtime_for
from tests.services import PostgresServer, ServiceMissing, service_unavailable

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def store() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
    except ServiceMissing as exc:
        server.stop()
        service_unavailable(str(exc))
    with server.connect() as conn:
        conn.execute("CREATE DATABASE orch")
    upgrade(server.url("orch"))
    yield server
    server.stop()


@pytest.fixture(params=["redis", "store"])
def leases(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings of the lease back end: Redis, or none (leases in the store)."""
    if request.param == "store":
        return {}
    return {"redis_url": str(request.getfixturevalue("redis_url"))}


def recover(
    store: PostgresServer, tmp_path: Path, leases: dict[str, str], *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env |= {"ORCH_DATABASE_URL": store.url("orch"), "ORCH_HOME": str(tmp_path / "home")}
    env |= {f"ORCH_{name.upper()}": value for name, value in leases.items()}
    return subprocess.run(
        [ORCHESTRATOR, "recover", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )


def test_recover_while_the_store_is_down_says_so_and_works_once_it_is_back(
    store: PostgresServer, tmp_path: Path, leases: dict[str, str]
) -> None:
    rt, _ = runtime_for(store.url("orch"), tmp_path / "scripts", **leases)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        claim_as_worker(rt, task_id, 1, "a worker that dies", 1.0)
    finally:
        rt.close()
    time.sleep(1.0)  # its lease ran out: the next sweep that reads the store requeues it

    store.pause()
    try:
        for flags in ((), ("--json",)):
            down = recover(store, tmp_path, leases, *flags)
            assert down.returncode == 1, down.stdout + down.stderr
            assert down.stdout == ""  # not "nothing to recover", not an empty report
            assert "Traceback" not in down.stderr
            [line] = down.stderr.splitlines()
            assert line.startswith(f"orchestrator: the store at {store.url('orch')} ")
            assert "is unavailable (cannot reach the database host)" in line
    finally:
        store.resume()

    back = recover(store, tmp_path, leases)
    assert back.returncode == 0, back.stderr
    assert back.stdout == (f"requeued task {task_id}: generation 1 lost, generation 2 queued\n"), (
        back.stdout
    )
    again = recover(store, tmp_path, leases)
    assert (again.returncode, again.stdout) == (0, "nothing to recover\n")
