"""The task stream's log and resume rules, in process on both stores (the live stream across a
SIGKILL runs in tests/acceptance/test_task_stream.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from tests.executions_support import runtime_for
from tests.outbox_support import waiting_task


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts", task_stream_poll_seconds=0.05)
    yield runtime
    runtime.close()


def parse(text: str) -> list[dict[str, Any]]:
    """SSE messages as {"event", "id", "data"}; comments (keep-alives) are skipped."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name in ("event", "id", "data"):
                fields[name] = json.loads(value) if name == "data" else value
        if fields:
            out.append(fields)
    return out


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
        # An id that is not one of ours behaves as a first connection, one above the newest
        # resumes at the newest.
        assert [m["event"] for m in stream(client, task_id, last_event_id="x")] == ["state"]
        assert [m["event"] for m in stream(client, task_id, last_event_id="99")] == ["state"]

        missing = client.get("/api/v1/tasks/no-such-task/stream")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
