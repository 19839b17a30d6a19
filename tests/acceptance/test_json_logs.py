"""With ORCH_LOG_FORMAT=json the sweeper and the worker write JSON lines: no start line, report
line or banner as free text beside them (a log shipper parsing each line as JSON drops those)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.store import migrations
from orchestrator.store.db import Database
from tests.acceptance.fleet import ORCHESTRATOR


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_"))}
    env.update(
        {
            "ORCH_HOME": str(tmp_path / "home"),
            "ORCH_LOG_FORMAT": "json",
            "ORCH_MODEL": f"scripted:{tmp_path}",
        }
    )
    return env


def _run_for(command: list[str], env: dict[str, str], tmp_path: Path, until: str) -> str:
    """Start `orchestrator COMMAND`, wait until its output holds `until`, stop it: the output."""
    path = tmp_path / "out.log"
    with path.open("wb") as out:
        process = subprocess.Popen(
            [ORCHESTRATOR, *command],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while until not in path.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # deaf to SIGTERM: say so, with what it wrote
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                said = path.read_text()
                raise AssertionError(f"still running 30 s after SIGTERM:\n{said}") from None
    text = path.read_text()
    assert until in text, text
    return text


def test_the_sweeper_writes_only_json_lines(tmp_path: Path) -> None:
    env = _env(tmp_path)
    url = f"sqlite:///{tmp_path / 'home' / 'orchestrator.db'}"
    migrations.upgrade(url)
    db = Database.from_url(url)
    TaskService(db, RecordingDispatcher()).trigger(Trigger(task_type="t", title="stale"))
    db.dispose()
    # Stale at the first sweep; republished again only long after this test stops it.
    env.update({"ORCH_QUEUED_STALE_SECONDS": "3", "ORCH_SWEEP_SECONDS": "0.5"})
    time.sleep(3.1)
    text = _run_for(["sweeper", "--no-outbox"], env, tmp_path, until="republished the wake-up")
    events = [json.loads(line)["event"] for line in text.splitlines()]  # each line is JSON
    assert any(event.startswith("sweeping every 0.5s") for event in events), events
    republished = [event for event in events if event.startswith("republished the wake-up")]
    assert len(republished) == 1, events  # logged by the sweep, not printed again


def test_the_worker_prints_no_banner(tmp_path: Path) -> None:
    env = _env(tmp_path)
    migrations.upgrade(f"sqlite:///{tmp_path / 'home' / 'orchestrator.db'}")
    text = _run_for(["worker", "--concurrency", "1"], env, tmp_path, until=" ready.")
    for part in ("[config]", "[queues]", ".> transport:", "[tasks]"):
        assert part not in text, text
    # Every line is JSON, a warning from before Celery sets up its logging too (as root:
    # Celery's superuser warning, eight lines of text), except Celery's stop line.
    lines = [line for line in text.splitlines() if line.strip() and "Warm shutdown" not in line]
    assert all(line.startswith("{") and json.loads(line) for line in lines), text
    ready = [line for line in text.splitlines() if " ready." in line]
    assert json.loads(ready[0])["logger"] == "celery.apps.worker"


def test_the_outbox_dispatcher_writes_only_json_lines(tmp_path: Path) -> None:
    env = _env(tmp_path)
    migrations.upgrade(f"sqlite:///{tmp_path / 'home' / 'orchestrator.db'}")
    text = _run_for(["outbox", "dispatch"], env, tmp_path, until="dispatching")
    events = [json.loads(line)["event"] for line in text.splitlines()]  # each line is JSON
    assert "dispatching nothing (no URL set)" in events, events


def test_the_worker_banner_names_the_embedded_brokers_folder(tmp_path: Path) -> None:
    """In text, the banner's transport is the broker's folder (it read
    `workers.filesystem_broker:Transport://:**@localhost//`)."""
    env = _env(tmp_path) | {"ORCH_LOG_FORMAT": "text"}
    migrations.upgrade(f"sqlite:///{tmp_path / 'home' / 'orchestrator.db'}")
    text = _run_for(["worker", "--concurrency", "1"], env, tmp_path, until=" ready.")
    folder = (tmp_path / "home" / "broker").resolve()
    [line] = [line for line in text.splitlines() if ".> transport:" in line]
    assert line.split(".> transport:")[1].strip() == f"filesystem://{folder}", text
