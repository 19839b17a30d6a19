"""The embedded fleet (no ORCH_REDIS_URL: Kombu's filesystem transport) starts without Kombu's
"No hostname was supplied. Reverting to default 'localhost'".

The file broker has no host, but Kombu's virtual transports default to `localhost`, and every
connection Kombu derives from the app's (the producer pool's when the sweeper re-sends a wake-up,
the worker's consumer and its banner) logged that warning: noise an operator reads as a broker
misconfigured. The real commands, run as processes, with a wake-up sent and taken.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.store.db import Database
from tests.acceptance.fleet import running_fleet
from tests.cli_in_process import embedded_store

NOISE = "No hostname was supplied"


def _embedded(tmp_path: Path) -> tuple[dict[str, str], str]:
    """An embedded fleet's environment with one queued task whose wake-up looks lost: it and
    the task's id."""
    home = tmp_path / "home"
    store = embedded_store(home)
    db = Database.from_url(store)
    try:
        trigger = Trigger(task_type="demo", title="t")
        task_id = TaskService(db, RecordingDispatcher()).trigger(trigger).task.task_id
    finally:
        db.dispose()
    (tmp_path / "scripts").mkdir()
    env = {
        "ORCH_HOME": str(home),
        "ORCH_MODEL": f"scripted:{tmp_path / 'scripts'}",
        "ORCH_QUEUED_STALE_SECONDS": "0.001",  # the wake-up (never sent) looks lost at once
    }
    return env, task_id


def test_the_embedded_sweeper_sends_a_wake_up_without_the_hostname_warning(
    tmp_path: Path,
) -> None:
    env, task_id = _embedded(tmp_path)
    with running_fleet(env, tmp_path) as fleet:
        swept = fleet.cli("sweeper", "--once")
    said = swept.stdout + swept.stderr
    assert swept.returncode == 0, said
    # It sent the wake-up through the file broker, where the warning was logged.
    assert f"republished the wake-up of task {task_id} generation 1" in said
    assert NOISE not in said


@pytest.mark.slow
def test_the_embedded_worker_starts_and_takes_a_wake_up_without_the_hostname_warning(
    tmp_path: Path,
) -> None:
    env, _ = _embedded(tmp_path)
    with running_fleet(env, tmp_path) as fleet:
        assert fleet.cli("sweeper", "--once").returncode == 0  # the wake-up, in the queue
        worker = fleet.worker(1)
        deadline = time.monotonic() + 60
        while "] received" not in fleet.logs() and time.monotonic() < deadline:
            assert worker.poll() is None, fleet.logs()
            time.sleep(0.2)
        assert fleet.ready(worker), fleet.logs()
        assert "orchestrator.run_generation" in fleet.logs()  # the wake-up, taken
        fleet.stop()
        assert "Connected to " in fleet.logs()
        assert NOISE not in fleet.logs()
