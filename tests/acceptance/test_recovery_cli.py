"""`orchestrator recover` and `orchestrator sweeper` on the embedded store.

A running generation whose lease expired is made in-process (a worker that claimed it and died);
the CLI then has to requeue it and say so. The loop sweeper survives a store it cannot use.
The sweeper runs as a real process (its signals, its logging on the process's stderr), and so
does `recover` where its stderr is at stake; what `recover` prints runs through `main()` in this
process (`tests.cli_in_process`), and the store is migrated in this process as `db upgrade`
would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.fleet import HEARTBEAT
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import migrations
from tests.acceptance.fleet import ORCHESTRATOR
from tests.cli_in_process import run_main
from tests.executions_support import claim_as_worker, runtime_for, wait_for
from tests.services import refused_port, serving_metrics

TTL = 0.3


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(home)}, **extra)
    return env


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ORCHESTRATOR, *args],
        capture_output=True,
        text=True,
        env=cli_env(home),
        cwd=home.parent,
        timeout=60,
    )


def recover(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`orchestrator recover ARGS`, in this process."""
    return run_main("recover", *args, env={"ORCH_HOME": str(home)}, cwd=home.parent)


def migrate(home: Path) -> None:
    """The embedded store in `home` brought to head, as `orchestrator db upgrade` does."""
    home.mkdir(parents=True, exist_ok=True)
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    migrate(folder)
    return folder


@pytest.fixture
def rt(home: Path, tmp_path: Path) -> Iterator[Runtime]:
    """The same embedded store (SQLite file, SQL leases), opened in the test process."""
    runtime, _ = runtime_for(f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts")
    yield runtime
    runtime.close()


def expired_task(rt: Runtime, title: str = "Leak") -> str:
    """A task whose generation 1 was claimed by a worker that died: its lease ran out."""
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title=title)).task.task_id
    claim_as_worker(rt, task_id, 1, "doomed-worker", TTL)
    time.sleep(TTL + 0.2)
    return task_id


def assert_requeued(rt: Runtime, task_id: str) -> None:
    view = rt.tasks.explain(task_id)
    assert (view["status"], view["generation"]) == ("queued", 2)
    assert [e["outcome"] for e in view["executions"]] == ["lost", None]


def test_recover_prints_what_it_requeued(home: Path, rt: Runtime) -> None:
    task_id = expired_task(rt)
    result = recover(home)
    assert result.returncode == 0, result.stderr
    assert f"requeued task {task_id}: generation 1 lost, generation 2 queued" in result.stdout
    assert_requeued(rt, task_id)

    again = recover(home)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "nothing to recover"


def test_recover_json(home: Path, rt: Runtime) -> None:
    first, second = expired_task(rt, "one"), expired_task(rt, "two")
    result = recover(home, "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert sorted(payload["requeued"], key=lambda r: r["task_id"]) == sorted(
        (
            {"task_id": first, "lost_generation": 1, "generation": 2},
            {"task_id": second, "lost_generation": 1, "generation": 2},
        ),
        key=lambda r: str(r["task_id"]),
    )
    assert payload["parked"] == []
    assert payload["republished"] == []
    assert_requeued(rt, first)
    assert_requeued(rt, second)

    again = json.loads(recover(home, "--json").stdout)
    assert again == {"requeued": [], "parked": [], "republished": [], "deferred": 0, "unsent": []}


@pytest.mark.redis
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_recover_says_when_it_cannot_check_the_leases(
    tmp_path: Path, home: Path, redis_url: str, json_flag: list[str]
) -> None:
    """Redis down: the expired generation is not checked, and `recover` says so and exits 1
    instead of "nothing to recover" and 0."""
    runtime, _ = runtime_for(
        f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts", redis_url=redis_url
    )
    try:
        task_id = expired_task(runtime)
    finally:
        runtime.close()
    down = f"redis://127.0.0.1:{refused_port()}/0"
    result = subprocess.run(
        [ORCHESTRATOR, "recover", *json_flag],
        capture_output=True,
        text=True,
        env=cli_env(home, ORCH_REDIS_URL=down),
        cwd=home.parent,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nothing to recover" not in result.stdout
    assert "Traceback" not in result.stderr
    said = result.stderr.strip().splitlines()
    assert len(said) == 1, result.stderr
    assert "lease back end is unavailable: 1 expired generation" in said[0]
    if json_flag:
        assert json.loads(result.stdout)["deferred"] == 1
    rt, _ = runtime_for(f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts")
    try:
        assert rt.tasks.get(task_id).generation == 1  # nothing was requeued blindly
    finally:
        rt.close()


def test_sweeper_once_prints_what_it_requeued_and_exits(home: Path, rt: Runtime) -> None:
    task_id = expired_task(rt)
    result = run_cli(home, "sweeper", "--once")
    assert result.returncode == 0, result.stderr
    assert "sweeping once" in result.stdout  # not the period of a loop it does not run
    assert "every" not in result.stdout
    assert f"requeued task {task_id}: generation 1 lost, generation 2 queued" in result.stdout
    assert_requeued(rt, task_id)


def test_sweeper_once_on_a_store_never_migrated_is_one_line(tmp_path: Path) -> None:
    store = tmp_path / "home" / "orchestrator.db"
    store.parent.mkdir()
    store.touch()
    result = run_cli(store.parent, "sweeper", "--once")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("orchestrator:")]
    assert len(errors) == 1, result.stderr
    assert "not migrated" in errors[0]


@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGINT])
def test_the_sweeper_loop_survives_a_failing_sweep(
    tmp_path: Path, stop_with: signal.Signals
) -> None:
    # The store is unusable at first (never migrated): every sweep fails. The loop logs one
    # line per failure and carries on; once the store is migrated, it sweeps normally.
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.db").touch()
    out, err = tmp_path / "sweeper.out", tmp_path / "sweeper.err"
    env = cli_env(
        home,
        ORCH_SWEEP_SECONDS="0.2",
        ORCH_LEASE_SECONDS="3",
        ORCH_LEASE_RENEW_SECONDS="1",
    )
    with out.open("wb") as stdout, err.open("wb") as stderr:
        sweeper = subprocess.Popen(
            [ORCHESTRATOR, "sweeper"], env=env, cwd=tmp_path, stdout=stdout, stderr=stderr
        )
    try:

        def failures() -> int:
            return err.read_text(errors="replace").count("sweep failed")

        wait_for(lambda: failures() >= 3, timeout=30, what="three failed sweeps")
        assert sweeper.poll() is None, err.read_text()

        migrate(home)
        runtime, _ = runtime_for(f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts")
        try:
            task_id = expired_task(runtime)
            wait_for(
                lambda: f"requeued task {task_id}" in out.read_text(errors="replace"),
                timeout=30,
                what="the requeue by the recovered loop",
            )
            assert_requeued(runtime, task_id)
        finally:
            runtime.close()
        assert sweeper.poll() is None

        sweeper.send_signal(stop_with)
        assert sweeper.wait(timeout=30) == 0
    finally:
        if sweeper.poll() is None:
            sweeper.kill()
            sweeper.wait()
    log = err.read_text(errors="replace")
    assert "Traceback" not in log
    failed = [line for line in log.splitlines() if "sweep failed" in line]
    assert failed
    assert all("OperationalError" in line and "retrying in 0.2s" in line for line in failed)


@pytest.mark.redis
def test_the_sweeper_loop_counts_a_sweep_that_could_not_check_the_leases_as_failed(
    tmp_path: Path, home: Path, redis_url: str
) -> None:
    """No heartbeat for it (the compose health check sees a sweeper that does not recover)."""
    runtime, _ = runtime_for(
        f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts", redis_url=redis_url
    )
    try:
        expired_task(runtime)
    finally:
        runtime.close()
    env = cli_env(
        home, ORCH_REDIS_URL=f"redis://127.0.0.1:{refused_port()}/0", ORCH_SWEEP_SECONDS="0.5"
    )
    env = {k: v for k, v in env.items() if not k.startswith("PROMETHEUS_")}
    log = tmp_path / "sweeper.log"
    argv = [ORCHESTRATOR, "sweeper", "--no-outbox"]
    sweeper, port = serving_metrics(argv, env, log, home.parent)  # a port no one else took
    try:

        def scraped(series: str) -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return 0.0
            for line in text.splitlines():
                if line.startswith(series):
                    return float(line.split()[-1])
            return 0.0

        wait_for(
            lambda: scraped('orchestrator_sweeps_total{result="failed"}') >= 2,
            30,
            what="two failed sweeps",
        )
        # How long Redis has not answered, for an alert (0 before the outage's first sweep).
        assert scraped("orchestrator_sweeper_redis_unreachable_seconds") > 0
    finally:
        os.killpg(sweeper.pid, signal.SIGTERM)
        sweeper.wait(timeout=30)
    out = log.read_bytes()
    assert not (home / HEARTBEAT).exists(), out
    # Said once for the outage, not at each failed sweep.
    assert out.count(b"does not answer") == 1, out
    assert b"1 expired generation(s) not checked" in out


def test_the_sweeper_says_each_requeue_once(tmp_path: Path) -> None:
    """In text mode each requeue was written twice: printed, and logged by the sweep itself."""
    home = tmp_path / "home"
    env = cli_env(home)
    migrate(home)
    runtime, _ = runtime_for(f"sqlite:///{home / 'orchestrator.db'}", tmp_path / "scripts")
    try:
        task_id = expired_task(runtime)
    finally:
        runtime.close()
    result = subprocess.run(
        [ORCHESTRATOR, "sweeper", "--once"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    said = result.stdout + result.stderr
    assert said.count(f"requeued task {task_id}") == 1, said
