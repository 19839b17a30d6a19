"""What the metrics tell the person paged about the fleet: wake-ups waiting, and free slots.

Before, a fleet whose workers were all busy (or gone) showed nothing but
`orchestrator_tasks{status="queued"}`, which is also high during a burst that is being served:
an operator could not tell tasks waiting for minutes from tasks about to start, nor a worker
with no free slot from an idle one.
"""

from __future__ import annotations

import signal
import subprocess
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.settings import load_settings
from orchestrator.store import migrations
from orchestrator.store.db import Database
from orchestrator.store.tables import tasks
from orchestrator.store.types import utcnow
from tests.acceptance.fleet import ORCHESTRATOR
from tests.executions_support import completing_turns, wait_for, write_script
from tests.integration.test_metrics import metrics_worker, scrape
from tests.services import RedisServer


def _value(text: str, name: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    return None


def test_the_oldest_queued_tasks_wait_is_a_gauge(sqlite_url: str, tmp_path: Path) -> None:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, api_token="tok")
    db = Database.from_url(sqlite_url)
    service = TaskService(db, RecordingDispatcher())
    with TestClient(create_app(settings, db=db)) as client:
        headers = {"Authorization": "Bearer tok"}
        empty = client.get("/metrics", headers=headers).text
        waiting = service.trigger(Trigger(task_type="demo", title="waits")).task.task_id
        service.trigger(Trigger(task_type="demo", title="just now"))
        with db.transaction() as conn:
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == waiting)
                .values(updated_at=utcnow() - timedelta(seconds=600))
            )
        text = client.get("/metrics", headers=headers).text
    db.dispose()
    assert _value(empty, "orchestrator_tasks_oldest_queued_seconds") == 0.0
    # A worker's gauges are its port's: the API showed a worker with no slots.
    assert "orchestrator_worker_" not in text, text
    age = _value(text, "orchestrator_tasks_oldest_queued_seconds")
    assert age is not None, text
    assert 600 <= age < 660
    assert "# TYPE orchestrator_tasks_oldest_queued_seconds gauge" in text


def test_a_worker_shows_its_slots_and_how_many_are_busy(tmp_path: Path, scripts: Path) -> None:
    home = tmp_path / "home"
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    write_script(scripts, "slow", completing_turns(delay_s=3.0))
    with metrics_worker(tmp_path, home, scripts, 1) as (_worker, env, port):
        scraped = partial(_scraped, port)
        idle = wait_for(
            lambda: _value(text := scraped(), "orchestrator_worker_ready") == 1.0 and text,
            40,
            0.2,
            what="the worker ready",
        )
        assert _value(idle, "orchestrator_worker_slots") == 1.0
        assert _value(idle, "orchestrator_worker_slots_busy") == 0.0
        _trigger_slow(env, tmp_path)
        wait_for(
            lambda: _value(scraped(), "orchestrator_worker_slots_busy") == 1.0,
            20,
            0.2,
            what="its one slot busy",
        )
        wait_for(
            lambda: 'orchestrator_tasks{status="completed"} 1.0' in (text := scraped()) and text,
            30,
            0.2,
            what="the round's end",
        )
        assert _value(scraped(), "orchestrator_worker_slots_busy") == 0.0


def _scraped(port: int) -> str:
    """The worker's /metrics, or "" while its port does not answer."""
    try:
        return scrape(port)
    except OSError:
        return ""


def _trigger_slow(env: dict[str, str], folder: Path) -> None:
    """One task of the slow script, triggered with the CLI (the worker's wake-up)."""
    subprocess.run(
        [ORCHESTRATOR, "tasks", "trigger", "--type", "slow", "--title", "s"],
        env=env,
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.slow
def test_a_worker_shows_its_slots_from_the_start_and_whether_it_takes_wake_ups(
    tmp_path: Path, scripts: Path
) -> None:
    """Before, `orchestrator_worker_slots` read 0 until Celery had started (its `worker_init`):
    a scrape in a worker's first seconds read a worker with no capacity. Its slots are its
    concurrency from the port's first answer; `orchestrator_worker_ready` says whether it takes
    wake-ups: 0 until Celery is ready (here: its broker does not answer yet), 1 then, 0 from a
    warm shutdown on, while its round runs on."""
    home = tmp_path / "home"
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    write_script(scripts, "slow", completing_turns(delay_s=3.0))
    broker = RedisServer()  # not started yet: the worker's broker does not answer
    try:
        with metrics_worker(tmp_path, home, scripts, 3, {"ORCH_REDIS_URL": broker.url}) as (
            worker,
            env,
            port,
        ):
            first = wait_for(lambda: _scraped(port), 40, 0.05, what="the port's first answer")
            assert _value(first, "orchestrator_worker_slots") == 3.0, first
            assert _value(first, "orchestrator_worker_ready") == 0.0, first
            assert "# TYPE orchestrator_worker_ready gauge" in first
            broker.start(keep_port=True)  # the worker has its URL
            ready = wait_for(
                lambda: _value(text := _scraped(port), "orchestrator_worker_ready") == 1.0 and text,
                40,
                0.2,
                what="the worker ready once its broker answers",
            )
            assert _value(ready, "orchestrator_worker_slots") == 3.0
            _trigger_slow(env, tmp_path)
            wait_for(
                lambda: _value(_scraped(port), "orchestrator_worker_slots_busy") == 1.0,
                20,
                0.1,
                what="one slot busy",
            )
            worker.send_signal(signal.SIGTERM)  # a warm shutdown: the round runs on
            stopping = wait_for(
                lambda: _value(text := _scraped(port), "orchestrator_worker_ready") == 0.0 and text,
                10,
                0.05,
                what="the worker not ready in its warm shutdown",
            )
            assert _value(stopping, "orchestrator_worker_slots_busy") == 1.0
    finally:
        broker.close()


def test_a_solo_worker_shows_one_slot_whatever_its_concurrency(
    tmp_path: Path, scripts: Path
) -> None:
    """The solo pool runs one wake-up at a time; before, its slots read its --concurrency."""
    home = tmp_path / "home"
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    write_script(scripts, "good", completing_turns())
    with metrics_worker(tmp_path, home, scripts, 4, pool="solo") as (_worker, _env, port):
        ready = wait_for(
            lambda: _value(text := _scraped(port), "orchestrator_worker_ready") == 1.0 and text,
            40,
            0.2,
            what="the worker ready",
        )
        assert _value(ready, "orchestrator_worker_slots") == 1.0, ready
