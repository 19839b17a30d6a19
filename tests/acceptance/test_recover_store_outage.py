"""`orchestrator recover` during and right after a Postgres outage, as an operator runs it.

While the store is down the sweep cannot read anything: `recover` must not print "nothing to
recover" and exit 0 (a script would take that for "all is well"), nor a traceback; it says in
one line that it could not reach the store and exits 1, with `--json` too (stdout empty). Once
the store is back, the same command requeues the generation whose lease ran out meanwhile,
after leaving it the sweeper's grace for its worker's hand-back.

A Postgres server of the test's own, really stopped (fast shutdown) and started again on its
port with its data; leases in Redis (the session's), or in the store when no Redis is set.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.services.tasks import Trigger
from orchestrator.store.migrations import upgrade
from orchestrator.store.types import utcnow
from tests.acceptance.fleet import ORCHESTRATOR
from tests.executions_support import claim_as_worker, runtime_for, wait_for
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


LEASE = 0.5


def test_recover_right_after_an_outage_leaves_a_late_hand_back_its_grace(
    store: PostgresServer, tmp_path: Path, redis_url: str
) -> None:
    """Postgres away longer than a round's lease: the round stopped, its worker released its
    lease and hands the generation back once the store answers (tried every second). `recover`
    run at once used to take the expired lease for a worker that died (`recoveries`, three of
    which park the task as recovery_limit), as the sweeper did before its grace after an
    outage. It now leaves expired leases to their hand-backs for the sweeper's grace, says so
    on stderr, and then requeues the generation as handed back."""
    leases = {"redis_url": redis_url}
    rt, _ = runtime_for(store.url("orch"), tmp_path / "scripts", **leases)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        token = claim_as_worker(rt, task_id, 1, "w1", LEASE)
        runs_out = utcnow() + timedelta(seconds=LEASE)
        store.pause()
        try:
            assert rt.leases.release(task_lease(task_id), token)  # the stopped round's worker
            wait_for(lambda: utcnow() > runs_out, 5, 0.05, what="the mirror to run out")
        finally:
            store.resume()

        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env |= {"ORCH_DATABASE_URL": store.url("orch"), "ORCH_HOME": str(tmp_path / "home")}
        env |= {"ORCH_REDIS_URL": redis_url}
        started = time.monotonic()
        cli = subprocess.Popen(
            [ORCHESTRATOR, "recover"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        try:
            assert cli.stderr is not None
            said = cli.stderr.readline()  # "" when it ended without waiting (the old code)
            # The worker's hand-back lands now, within the grace.
            rt.executions.handback.give_back(Fence(task_id, 1, token))
            out, err = cli.communicate(timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        took = time.monotonic() - started
        assert cli.returncode == 0, said + err
        assert out == (
            f"requeued task {task_id}: generation 1 handed back by its worker after an outage (the "
            "store or Redis failed under its round), generation 2 queued\n"
        ), out
        task = rt.tasks.get(task_id)
        assert (task.generation, task.recoveries, task.handbacks) == (2, 0, 1)
        assert said == (
            "orchestrator recover: 1 expired lease(s) left 3s to their workers' hand-backs "
            "(a round a store outage stopped is handed back once the store answers; "
            "--no-grace takes them now)\n"
        )
        assert took >= 3.0
    finally:
        rt.close()


@pytest.mark.parametrize("flags", [(), ("--no-grace",)])
def test_recover_takes_a_dead_workers_lease_after_the_grace_or_at_once(
    store: PostgresServer, tmp_path: Path, leases: dict[str, str], flags: tuple[str, ...]
) -> None:
    """No hand-back comes (the worker died): after the grace the lease is recovered as lost;
    with --no-grace at once, and nothing is said on stderr."""
    rt, _ = runtime_for(store.url("orch"), tmp_path / "scripts", **leases)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        claim_as_worker(rt, task_id, 1, "a worker that dies", LEASE)
    finally:
        rt.close()
    time.sleep(LEASE + 0.2)
    started = time.monotonic()
    done = recover(store, tmp_path, leases, *flags)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"requeued task {task_id}: generation 1 lost, generation 2 queued\n"
    if flags:
        assert done.stderr == ""  # no wait (its time is the process's start, under load)
    else:
        assert "1 expired lease(s) left 3s to their workers' hand-backs" in done.stderr
        assert took >= 3.0
