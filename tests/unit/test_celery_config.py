"""The Celery configuration that makes delivery a wake-up, not an order."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.settings import load_settings
from workers.celery_app import (
    CLEANUP_INTERVAL_SECONDS,
    VISIBILITY_TIMEOUT_SECONDS,
    CeleryDispatcher,
    make_celery,
)
from workers.constants import CLEANUP, QUEUE, RUN_GENERATION, SWEEP


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


def test_embedded_publishing_writes_nothing_outside_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kombu's filesystem transport keeps its exchange table in `control_folder`, by default
    # `control/` in the working directory of whichever process publishes.
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    CeleryDispatcher(make_celery(load_settings(home=home))).dispatch("t-1", 1)
    assert list(elsewhere.iterdir()) == []
    assert any(path.name.endswith(".exchange") for path in home.rglob("*"))
