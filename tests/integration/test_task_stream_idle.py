"""What idle task streams cost the store, and that their events still come at once.

Every open stream read the store every `ORCH_TASK_STREAM_POLL_SECONDS` (1 s) even with Redis,
whose wake-up tells the stream when an event of its task committed: 400 console tabs were 400
reads a second for nothing. With the wake-ups live the read is only the safety net for a lost
one (the hub's poll, 5 s); without them (no Redis, or its subscription down) the stream's own
poll is still the only way to see another process's events, and stays as it was.

The streams here are real HTTP streams of a uvicorn server over the Postgres store.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.events import PlanHub
from orchestrator.runtime import Runtime
from orchestrator.services.task_stream import TaskStreamService
from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for, settings_for, wait_for
from tests.integration.test_task_stream import seconds_to_see_cancel
from tests.services import bound_socket, refused_port

STREAMS = 20
WINDOW = 2.5  # seconds the idle streams are watched


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each task stream read the store for its new events (the real read is made)."""
    seen: list[float] = []
    real = TaskStreamService.events_after

    def counted(self: TaskStreamService, *args: Any, **kwargs: Any) -> Any:
        seen.append(time.monotonic())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TaskStreamService, "events_after", counted)
    return seen


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` behind a real uvicorn on a free loopback port, for as long as the block runs."""
    sock = bound_socket()  # its port cannot be taken by another process before uvicorn listens
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 10, 0.02, what="uvicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def idle_reads(url: str, task_ids: list[str], reads: list[float]) -> int:
    """Open a stream per task, wait until each has made its first read, then count the reads
    the idle streams make in WINDOW seconds."""

    async def watch() -> int:
        async with (
            httpx.AsyncClient(base_url=url, timeout=30) as http,
            contextlib.AsyncExitStack() as streams,
        ):
            # Each stream's line iterator is kept: one dropped is closed, and its stream ends.
            open_lines = []
            for task_id in task_ids:
                response = await streams.enter_async_context(
                    http.stream("GET", f"/api/v1/tasks/{task_id}/stream")
                )
                assert response.status_code == 200
                lines = response.aiter_lines()
                open_lines.append(lines)
                async for line in lines:
                    if line.startswith("data: "):
                        break  # the snapshot: the first read follows it
            made = len(task_ids)
            await asyncio.to_thread(wait_for, lambda: len(reads) >= made, 10, 0.01, "first reads")
            start = time.monotonic()
            await asyncio.sleep(WINDOW)  # the measurement: what idle streams do meanwhile
            return sum(1 for at in reads if start <= at < start + WINDOW)

    return asyncio.run(watch())


def waiting_tasks(rt: Runtime, count: int) -> list[str]:
    trigger = rt.tasks.trigger
    return [trigger(Trigger(task_type="x", title=f"idle {n}")).task.task_id for n in range(count)]


def test_idle_streams_leave_the_store_alone_while_redis_wakes_them(
    pg_url: str, redis_url: str, tmp_path: Path, reads: list[float]
) -> None:
    rt, _ = runtime_for(pg_url, tmp_path / "scripts", redis_url=redis_url)
    try:
        app = create_app(rt.settings, db=rt.db, keepalive_seconds=60)
        with serving(app) as url:
            wait_for(app.state.hub.subscribed.is_set, 10, 0.02, what="the hub's subscription")
            count = idle_reads(url, waiting_tasks(rt, STREAMS), reads)
    finally:
        rt.close()
    # Before: each read once a second, 20 streams x 2.5 s = about 50 reads; now none until the
    # safety net's 5 s.
    assert count < STREAMS // 2, f"{count} reads of {STREAMS} idle streams in {WINDOW} s"


def test_without_redis_idle_streams_still_poll_at_the_setting(
    pg_url: str, tmp_path: Path, reads: list[float]
) -> None:
    """Embedded: no wake-up comes from another process, so the poll is the only way."""
    rt, _ = runtime_for(pg_url, tmp_path / "scripts", task_stream_poll_seconds=0.25)
    try:
        app = create_app(rt.settings, db=rt.db, keepalive_seconds=60)
        with serving(app) as url:
            count = idle_reads(url, waiting_tasks(rt, 4), reads)
    finally:
        rt.close()
    assert count >= 4 * 6, f"{count} reads of 4 streams polling every 0.25 s in {WINDOW} s"


def test_an_event_of_another_process_reaches_an_open_stream_at_once_with_redis(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The default settings: the wake-up brings it, not the poll (the safety net is 5 s)."""
    worker, _ = runtime_for(pg_url, tmp_path / "scripts", redis_url=redis_url)
    try:
        task_id = worker.tasks.trigger(Trigger(task_type="x", title="woken")).task.task_id
        app = create_app(worker.settings, keepalive_seconds=60)  # a database of its own
        with TestClient(app) as client:
            wait_for(app.state.hub.subscribed.is_set, 10, 0.02, what="the hub's subscription")
            delay = seconds_to_see_cancel(
                client, task_id, lambda: worker.tasks.cancel(task_id, "not needed")
            )
    finally:
        worker.close()
    assert delay < 0.5, f"the status came {delay:.2f} s after the commit"


def test_the_safety_net_delivers_an_event_whose_wake_up_was_lost(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The committing process sends no wake-up (no Redis of its own) while the API's Redis
    subscription is live: the hub's safety-net read finds the event."""
    worker, _ = runtime_for(pg_url, tmp_path / "scripts")  # commits, wakes nobody
    try:
        task_id = worker.tasks.trigger(Trigger(task_type="x", title="lost")).task.task_id
        settings = settings_for(
            pg_url, tmp_path / "scripts", redis_url=redis_url, task_stream_poll_seconds=30
        )
        hub = PlanHub(redis_url, poll_seconds=0.5)
        app = create_app(settings, hub=hub, keepalive_seconds=60)
        with TestClient(app) as client:
            wait_for(hub.subscribed.is_set, 10, 0.02, what="the hub's subscription")
            delay = seconds_to_see_cancel(
                client, task_id, lambda: worker.tasks.cancel(task_id, "not needed")
            )
    finally:
        worker.close()
    assert delay < 2.0, f"the status came {delay:.2f} s after the commit"


def test_while_the_redis_subscription_is_down_the_stream_polls_at_the_setting(
    pg_url: str, tmp_path: Path
) -> None:
    """Redis configured but unreachable: no wake-up can come, so the stream's own poll (here
    0.05 s) is what finds the event, not the hub's safety net (here 30 s)."""
    dead = f"redis://127.0.0.1:{refused_port()}/0"  # nothing listens there
    worker, _ = runtime_for(pg_url, tmp_path / "scripts")
    try:
        task_id = worker.tasks.trigger(Trigger(task_type="x", title="down")).task.task_id
        settings = settings_for(
            pg_url, tmp_path / "scripts", redis_url=dead, task_stream_poll_seconds=0.05
        )
        hub = PlanHub(dead, poll_seconds=30)
        with TestClient(create_app(settings, hub=hub, keepalive_seconds=60)) as client:
            assert not hub.subscribed.is_set()
            delay = seconds_to_see_cancel(
                client, task_id, lambda: worker.tasks.cancel(task_id, "not needed")
            )
    finally:
        worker.close()
    assert delay < 1.0, f"the status came {delay:.2f} s after the commit"
