"""Prometheus metrics: the API's /metrics (counts from the store, behind the token) and the
worker's metrics port summing its prefork pool processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.domain.vocabulary import EXECUTION_OUTCOMES
from orchestrator.metrics_folders import OWNER_FILE
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.executions import RunResult
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.settings import load_settings
from orchestrator.store import migrations
from orchestrator.store.db import Database
from tests.acceptance.fleet import ORCHESTRATOR
from tests.executions_support import completing_turns, runtime_for, wait_for, write_script
from tests.integration.test_metrics_folders import exited_process, folder_of
from tests.services import refused_port, serving_metrics


def test_api_metrics_count_tasks_from_the_store(sqlite_url: str, tmp_path: Path) -> None:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, api_token="tok")
    db = Database.from_url(sqlite_url)
    service = TaskService(db, RecordingDispatcher())
    for n in range(3):
        service.trigger(Trigger(task_type="demo", title=f"t{n}"))
    with TestClient(create_app(settings, db=db)) as client:
        assert client.get("/metrics").status_code == 401
        response = client.get("/metrics", headers={"Authorization": "Bearer tok"})
    db.dispose()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'orchestrator_tasks{status="queued"} 3.0' in text
    assert 'orchestrator_tasks{status="failed"} 0.0' in text
    assert "orchestrator_approvals_pending 0.0" in text
    assert "# TYPE orchestrator_executions_ended_total counter" in text


def test_every_known_label_value_is_a_series_at_zero_before_any_event(tmp_path: Path) -> None:
    """An alert on `rate(orchestrator_sweeps_total{result="failed"}[5m]) > 0` needs the series
    before the first failure: a fresh process's scrape shows each known value at 0."""
    from prometheus_client.parser import text_string_to_metric_families

    scrape = subprocess.run(
        [
            sys.executable,
            "-c",
            "from orchestrator.metrics import render; print(render(None).decode())",
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scrape)
        for s in family.samples
    }
    expected = [
        ("orchestrator_sweeps_total", "result", ("ok", "failed")),
        ("orchestrator_executions_ended_total", "outcome", (*EXECUTION_OUTCOMES, "stopped")),
        ("orchestrator_verifications_total", "result", ("matched", "differs", "unavailable")),
        ("orchestrator_approvals_decided_total", "decision", ("approved", "rejected")),
    ]
    for name, label, values in expected:
        for value in values:
            assert samples.get((name, ((label, value),))) == 0.0, (name, value)


@pytest.mark.postgres
@pytest.mark.redis
def test_only_a_process_that_sweeps_exports_the_sweepers_redis_gauge(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    """The API and the workers serve this module's registry and never sweep: they exported
    `orchestrator_sweeper_redis_unreachable_seconds` at 0 for ever, which a dashboard summing
    or averaging it over the fleet read as Redis answering. It is exported by a process once
    it swept with Redis: the sweeper (or a worker running `--beat`'s sweeps)."""
    name = "orchestrator_sweeper_redis_unreachable_seconds"
    code = (
        "import sys\n"
        "from orchestrator.metrics import render\n"
        "print(render(None).decode())\n"
        "if len(sys.argv) > 1:\n"
        "    from orchestrator.runtime import build_runtime\n"
        "    from orchestrator.settings import load_settings\n"
        "    rt = build_runtime(load_settings(database_url=sys.argv[1], redis_url=sys.argv[2],"
        " home=sys.argv[3]))\n"
        "    rt.sweeper.sweep()\n"
        "    rt.close()\n"
        "    print('--- swept ---')\n"
        "    print(render(None).decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMETHEUS_", "ORCH_"))}
    ran = subprocess.run(
        [sys.executable, "-c", code, pg_url, redis_url, str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    before, after = ran.stdout.split("--- swept ---")
    assert name not in before  # what the API and a worker serve
    assert f"{name} 0.0" in after  # what a sweeper serves, Redis answering


def scrape(port: int) -> str:
    """The metrics a process serves on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return str(response.read().decode())


@contextmanager
def metrics_worker(
    tmp_path: Path,
    home: Path,
    scripts: Path,
    concurrency: int,
    settings: dict[str, str] | None = None,
    pool: str = "threads",
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str], int]]:
    """An `orchestrator worker` on the store in `home`, serving its metrics on a port of its
    own (a new one if another process took it first), with the scripted model and any other
    `settings`, on `pool`, once its port answers: (the process, its environment, the port); stopped
    after. Its output is in `tmp_path / "worker.log"`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_"))}
    env.update({"ORCH_HOME": str(home), "ORCH_MODEL": f"scripted:{scripts}", **(settings or {})})
    argv = [ORCHESTRATOR, "worker", "--pool", pool, "--concurrency", str(concurrency)]
    worker, port = serving_metrics(argv, env, tmp_path / "worker.log", tmp_path)
    try:
        yield worker, env, port
    finally:
        with contextlib.suppress(ProcessLookupError):  # its group: prefork's pool processes too
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


@pytest.mark.slow
def test_the_worker_serves_metrics_on_its_port(tmp_path: Path, scripts: Path) -> None:
    home = tmp_path / "home"
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    write_script(scripts, "good", completing_turns())
    # Folders earlier workers left behind: removed at start once their process is gone.
    left = [
        folder_of(home / "metrics", exited_process()),
        folder_of(home / "metrics", None, pid=exited_process().pid),
    ]
    with metrics_worker(tmp_path, home, scripts, 2) as (worker, env, port):
        text = ""
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                text = scrape(port)
                break
            except OSError:
                time.sleep(0.3)
        assert 'orchestrator_tasks{status="queued"} 0.0' in text, text[:500]
        assert not [folder for folder in left if folder.exists()]
        assert (home / "metrics" / f"worker-{worker.pid}" / OWNER_FILE).is_file()
        subprocess.run(
            [ORCHESTRATOR, "tasks", "trigger", "--type", "good", "--title", "g"],
            env=env,
            cwd=tmp_path,
            check=True,
            capture_output=True,
            timeout=60,
        )
        # The round runs in a pool process; the parent's port shows its counters. The task's
        # status is the store's and the ended counter is counted after the round's end committed
        # (once its clean-up is done): a scrape between the two shows one without the other.
        ended = 'orchestrator_executions_ended_total{outcome="completed"} 1.0'
        while time.monotonic() < deadline:
            text = scrape(port)
            if 'orchestrator_tasks{status="completed"} 1.0' in text and ended in text:
                break
            time.sleep(0.3)
        assert 'orchestrator_tasks{status="completed"} 1.0' in text, text[-2000:]
        assert "orchestrator_executions_started_total 1.0" in text
        assert ended in text
        tool_lines = [
            line for line in text.splitlines() if line.startswith("orchestrator_tool_calls")
        ]
        assert any('tool="read_task_context"' in line for line in tool_lines), tool_lines


def test_the_sweepers_metrics_answer_while_the_store_is_down(tmp_path: Path) -> None:
    """A scrape during an outage shows the failed sweeps, without a traceback in the log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_"))}
    env.update(
        {
            "ORCH_HOME": str(tmp_path / "home"),
            "ORCH_DATABASE_URL": f"postgresql+psycopg://orch:pw@127.0.0.1:{refused_port()}/orch",
            "ORCH_SWEEP_SECONDS": "0.5",
        }
    )
    argv = [ORCHESTRATOR, "sweeper", "--no-outbox"]
    sweeper, port = serving_metrics(argv, env, tmp_path / "sweeper.log", tmp_path)
    try:
        status, text = 0, ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    status, text = r.status, r.read().decode()
                # The series is there at 0 from the start: wait for the first failed sweep.
                if _failed_sweeps(text) >= 1:
                    break
            except urllib.error.HTTPError as exc:
                status, text = exc.code, ""
                break
            except OSError:
                pass
            time.sleep(0.3)
    finally:
        os.killpg(sweeper.pid, signal.SIGTERM)
        sweeper.wait(timeout=20)
    logged = (tmp_path / "sweeper.log").read_text()
    assert status == 200, logged[-3000:]
    assert _failed_sweeps(text) >= 1, text
    assert "orchestrator_tasks{" not in text  # the counts the store could not give are left out
    assert "Traceback" not in logged, logged[-3000:]
    assert "left out of this scrape" in logged


def _sample(name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.metrics import render

    for family in text_string_to_metric_families(render(None).decode()):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    raise AssertionError(f"{name} is not exposed")


def test_an_execution_counts_as_started_while_its_round_runs(
    sqlite_url: str, scripts: Path
) -> None:
    """`executions_started_total - executions_ended_total` is what runs now: a long round, or
    one whose worker dies in it, has started."""
    rt, _ = runtime_for(sqlite_url, scripts)
    write_script(scripts, "slow", completing_turns(delay_s=2.0))
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="slow", title="s")).task.task_id
        before = _sample("orchestrator_executions_started_total")
        results: list[RunResult] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        wait_for(
            lambda: rt.tasks.explain(task_id)["status"] == "running", 10, what="the round runs"
        )
        during = _sample("orchestrator_executions_started_total")
        worker.join(timeout=30)
    finally:
        rt.close()
    assert results[0].outcome == "completed"
    assert during - before == 1
    assert _sample("orchestrator_executions_started_total") - before == 1  # once, not again


def _failed_sweeps(text: str) -> float:
    """`orchestrator_sweeps_total{result="failed"}` in a scrape; -1 when it is not there."""
    for line in text.splitlines():
        if line.startswith('orchestrator_sweeps_total{result="failed"}'):
            return float(line.split()[-1])
    return -1
