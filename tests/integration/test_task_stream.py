"""The task stream's log and resume rules, in process on both stores (the live stream across a
SIGKILL runs in tests/acceptance/test_task_stream.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for, settings_for, wait_for
from tests.outbox_support import waiting_task
from tests.sse_support import parse


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts", task_stream_poll_seconds=0.05)
    yield runtime
    runtime.close()


def stream(client: TestClient, task_id: str, last_event_id: str | None = None) -> list[Any]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with client.stream("GET", f"/api/v1/tasks/{task_id}/stream", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse(response.read().decode())


def test_a_finished_task_streams_its_snapshot_and_resumes_from_last_event_id(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(action_id, approve=False, by="duty engineer", note="no")
    rt.tasks.cancel(task_id, "not needed")
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        [state] = stream(client, task_id)  # finished: the snapshot is everything
        assert state["event"] == "state"
        assert state["id"] == "7"
        assert state["data"]["status"] == "cancelled"
        assert state["data"]["plan"]["revision"] == 2
        assert state["data"]["last_event_id"] == 7

        resumed = stream(client, task_id, last_event_id="2")
        assert resumed[0]["event"] == "state"
        assert "id" not in resumed[0]  # a resumed snapshot does not move the client's id
        rest = resumed[1:]
        assert [(m["id"], m["event"]) for m in rest] == [
            ("3", "action_proposed"),
            ("4", "status"),
            ("5", "action_decided"),
            ("6", "status"),
            ("7", "status"),
        ]
        assert rest[1]["data"]["status"] == "waiting"
        assert rest[2]["data"]["action"]["action_id"] == action_id
        # The rejection left nothing waiting: the next generation was queued at once.
        assert (rest[3]["data"]["status"], rest[3]["data"]["generation"]) == ("queued", 2)
        assert rest[4]["data"]["status"] == "cancelled"

        from_start = stream(client, task_id, last_event_id="0")
        plans = [m for m in from_start if m["event"] == "execution_plan"]
        assert [m["data"]["plan"]["revision"] for m in plans] == [1, 2]
        assert [m["id"] for m in from_start[1:]] == [str(n) for n in range(1, 8)]
        # An id that is not one of ours behaves as a first connection.
        assert [m["event"] for m in stream(client, task_id, last_event_id="x")] == ["state"]

        # The browser's reconnect after the stream ended (it sends the last id it saw, here
        # the snapshot's): nothing follows a finished task's last event, and a 204 is what
        # stops an EventSource from reconnecting every few seconds forever. An id above the
        # newest resumes at the newest, so it gets the same answer.
        for seen in ("7", "99"):
            again = client.get(f"/api/v1/tasks/{task_id}/stream", headers={"Last-Event-ID": seen})
            assert again.status_code == 204, again.text
            assert again.content == b""

        missing = client.get("/api/v1/tasks/no-such-task/stream")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"


def next_status(lines: Iterator[str]) -> dict[str, Any]:
    """Read SSE lines until a `status` event; its data."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event == "status":
            data: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return data
    raise AssertionError("the stream ended without a status event")


def seconds_to_see_cancel(client: TestClient, task_id: str, cancel: Any) -> float:
    """Open the task's stream, cancel the task from another thread once the snapshot is in,
    and time the cancel's commit -> its `status` event on the stream."""
    with client.stream("GET", f"/api/v1/tasks/{task_id}/stream") as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("event: state"):
                break
        committed: list[float] = []

        def later() -> None:
            time.sleep(0.3)  # the stream is waiting by now
            cancel()
            committed.append(time.monotonic())

        thread = threading.Thread(target=later)
        thread.start()
        status = next_status(lines)
        seen = time.monotonic()
        thread.join()
    assert status["status"] == "cancelled"
    return seen - committed[0]


def test_a_task_event_committed_by_a_worker_wakes_the_stream_through_redis(
    store_url: str, redis_url: str, tmp_path: Path
) -> None:
    # The stream's own poll is 30 s: only the wake-up can bring the event sooner.
    worker, _ = runtime_for(
        store_url, tmp_path / "scripts", redis_url=redis_url, task_stream_poll_seconds=30
    )
    try:
        task_id = worker.tasks.trigger(Trigger(task_type="x", title="woken")).task.task_id
        app = create_app(worker.settings, keepalive_seconds=60)  # a database of its own
        with TestClient(app) as client:
            wait_for(app.state.hub.subscribed.is_set, 10, 0.02, what="the hub's subscription")
            delay = seconds_to_see_cancel(
                client, task_id, lambda: worker.tasks.cancel(task_id, "not needed")
            )
        assert delay < 2.0, f"the status came {delay:.2f} s after the commit"
    finally:
        worker.close()


def test_a_task_event_committed_in_the_api_process_wakes_the_stream_without_redis(
    store_url: str, tmp_path: Path
) -> None:
    settings = settings_for(store_url, tmp_path / "scripts", task_stream_poll_seconds=30)
    app = create_app(settings, keepalive_seconds=60)
    with TestClient(app) as client:
        task_id = client.post("/api/v1/tasks", json={"task_type": "x", "title": "t"}).json()[
            "task_id"
        ]

        def cancel() -> None:
            answer = client.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "stop"})
            assert answer.status_code == 200, answer.text

        delay = seconds_to_see_cancel(client, task_id, cancel)
    assert delay < 2.0, f"the status came {delay:.2f} s after the commit"
