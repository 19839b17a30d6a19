"""The Celery configuration that makes delivery a wake-up, not an order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.settings import load_settings
from workers.celery_app import (
    CLEANUP_INTERVAL_SECONDS,
    VISIBILITY_TIMEOUT_SECONDS,
    make_celery,
)
from workers.constants import CLEANUP, QUEUE, RUN_GENERATION, SENT_AGAIN, SWEEP

ROOT = Path(__file__).resolve().parents[2]


def test_acks_late_reject_on_lost_worker_and_one_message_at_a_time(tmp_path: Path) -> None:
    conf = make_celery(load_settings(home=tmp_path, redis_url="redis://127.0.0.1:1/0")).conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_url == "redis://127.0.0.1:1/0"
    timeout = conf.broker_transport_options["visibility_timeout"]
    assert timeout == VISIBILITY_TIMEOUT_SECONDS
    assert timeout > 3600  # longer than any round may run
    assert conf.task_routes[RUN_GENERATION]["queue"] == QUEUE
    # The mended Redis transport (workers/broker.py) and rounds left running on a lost connection.
    assert conf.broker_transport == "workers.broker:Transport"
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False


def test_beat_sweeps_every_sweep_interval(tmp_path: Path) -> None:
    conf = make_celery(load_settings(home=tmp_path, sweep_seconds=7)).conf
    entry = conf.beat_schedule["sweep"]
    assert (entry["task"], entry["schedule"]) == (SWEEP, 7)


def test_embedded_mode_uses_the_filesystem_transport_under_home(tmp_path: Path) -> None:
    conf = make_celery(load_settings(home=tmp_path)).conf
    assert conf.broker_url == "filesystem://"
    folder = Path(conf.broker_transport_options["data_folder_in"])
    assert folder.is_dir()
    assert folder.is_relative_to(tmp_path.resolve())


def test_beat_runs_the_cleanup_task_hourly_on_the_queue(tmp_path: Path) -> None:
    conf = make_celery(load_settings(home=tmp_path)).conf
    entry = conf.beat_schedule["cleanup"]
    assert (entry["task"], entry["schedule"]) == (CLEANUP, CLEANUP_INTERVAL_SECONDS)
    assert CLEANUP_INTERVAL_SECONDS == 3600
    assert conf.task_routes[CLEANUP]["queue"] == QUEUE


def test_the_cleanup_task_is_registered_under_its_name() -> None:
    from workers.celery_app import app
    from workers.tasks import cleanup

    assert cleanup.name == CLEANUP
    assert CLEANUP in app.tasks


def test_embedded_publishing_writes_nothing_outside_home(tmp_path: Path) -> None:
    # Kombu's filesystem transport keeps its exchange table in `control_folder`, by default
    # `control/` in the working directory of whichever process publishes. A fresh process:
    # Kombu declares an exchange once per process, so an earlier test could hide the write.
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    elsewhere.mkdir()
    publish = (
        "from orchestrator.settings import load_settings\n"
        "from workers.celery_app import CeleryDispatcher, make_celery\n"
        f"CeleryDispatcher(make_celery(load_settings(home={str(home)!r}))).dispatch('t-1', 1)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(PYTHONPATH=str(ROOT), ORCH_HOME=str(home))  # the module's own app too
    subprocess.run([sys.executable, "-c", publish], cwd=elsewhere, env=env, check=True)
    assert list(elsewhere.iterdir()) == []
    assert any(path.name.endswith(".exchange") for path in home.rglob("*"))


def _request_of(headers: dict[str, Any] | None = None, **delivery: Any) -> Any:
    """The `self.request` a worker builds for a run_generation message: Celery's own message
    headers, with those the publisher added, and the message's delivery info."""
    from celery.app.task import Context

    from workers.celery_app import app

    message_headers, *_ = app.amqp.create_task_message("id-1", RUN_GENERATION, ["t-1", 1], {})
    message_headers.update(headers or {})  # as amqp.send_task_message adds them
    return Context(dict(message_headers, delivery_info={"redelivered": False, **delivery}))


def test_only_a_wake_up_delivered_once_is_a_first_delivery() -> None:
    """It takes the lease before it reads the store; every wake-up that may find its generation
    claimed by another reads the store first (services/executions.py)."""
    from workers.tasks import first_delivery

    assert first_delivery(_request_of())
    assert not first_delivery(_request_of({SENT_AGAIN: True}))  # the sweeper republished it
    assert not first_delivery(_request_of(redelivered=True))  # Kombu handed it out again
    assert not first_delivery(_request_of({"redelivered": True}))  # Kombu's restored headers
    assert not first_delivery(_request_of({"retries": 1}))  # a Celery retry
