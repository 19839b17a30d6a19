"""Celery's own view matches the store's: a generation that ends `failed` is a Celery failure
(what Flower counts from the task events), one that completes is a success. The same real
worker writes JSON log lines naming task, generation, session and worker, and no secret."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet
from tests.executions_support import completing_turns, report_call, runtime_for, write_script
from workers.celery_app import CeleryDispatcher, make_celery

TOKEN = "api-token-9d8c7b6a5f4e3d2c1b0a"


@pytest.fixture
def rt(sqlite_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(sqlite_url, scripts, redis_url=redis_url)
    runtime.dispatcher = CeleryDispatcher(make_celery(runtime.settings))
    yield runtime
    runtime.close()


@pytest.mark.slow
def test_a_failed_generation_is_a_celery_failure(
    rt: Runtime, sqlite_url: str, redis_url: str, scripts: Path, tmp_path: Path
) -> None:
    write_script(scripts, "good", completing_turns())
    write_script(scripts, "bad", [{"tool_calls": [report_call("c1", "failed")]}, {"content": "x"}])
    fleet = Fleet(
        {
            "ORCH_DATABASE_URL": sqlite_url,
            "ORCH_REDIS_URL": redis_url,
            "ORCH_MODEL": f"scripted:{scripts}",
            "ORCH_HOME": str(tmp_path / "home"),
            "ORCH_LOG_FORMAT": "json",
            "ORCH_API_TOKEN": TOKEN,
        },
        tmp_path,
    )
    celery = make_celery(rt.settings)
    events: list[tuple[str, str]] = []

    def record(event: dict[str, Any]) -> None:
        events.append((event["type"], event.get("uuid", "")))

    connection = celery.connection()
    receiver = celery.events.Receiver(
        connection, handlers={"task-succeeded": record, "task-failed": record}
    )
    # capture() loops until should_stop, waking every second to check it.
    listener = threading.Thread(target=receiver.capture, kwargs={"limit": None}, daemon=True)
    try:
        worker = fleet.worker(concurrency=1)
        deadline = time.monotonic() + 60
        while not fleet.ready(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.ready(worker), fleet.logs()
        listener.start()
        # What Flower does on start: ask the workers to send task events.
        celery.control.enable_events()
        time.sleep(1.0)
        good = rt.tasks.trigger(Trigger(task_type="good", title="g")).task.task_id
        bad = rt.tasks.trigger(Trigger(task_type="bad", title="b")).task.task_id
        while time.monotonic() < deadline and len(events) < 2:
            time.sleep(0.2)
        assert rt.tasks.get(good).status == "completed", fleet.logs()
        assert rt.tasks.get(bad).status == "failed", fleet.logs()
        kinds = sorted(kind for kind, _ in events)
        assert kinds == ["task-failed", "task-succeeded"], (events, fleet.logs())
    finally:
        receiver.should_stop = True
        listener.join(timeout=10)
        connection.release()
        fleet.stop()
    lines = [
        json.loads(line)
        for line in (tmp_path / "worker-0.log").read_text().splitlines()
        if line.startswith("{")
    ]
    assert lines, fleet.logs()
    ours = [line for line in lines if line.get("task_id") == bad and "generation" in line]
    assert ours, lines[-5:]
    assert {"session_id", "worker", "event"} <= set(ours[-1])
    text = (tmp_path / "worker-0.log").read_text()
    assert TOKEN not in text
    assert "Traceback" not in text  # GenerationFailed is an expected failure: one line
