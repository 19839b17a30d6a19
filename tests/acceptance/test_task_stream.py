"""The task stream with real processes: `orchestrator api`, workers and a sweeper on Postgres and
Redis. It follows a task through a SIGKILLed worker into generation 2; the client drops, the API
restarts, and `Last-Event-ID` resumes with no event missing or repeated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.store import task_events as event_store
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import completing_turns, runtime_for, write_script


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": "3",
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": "1",
        "ORCH_QUEUED_STALE_SECONDS": "3",
        "ORCH_TASK_STREAM_POLL_SECONDS": "0.1",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


def start_api(fleet: Fleet) -> tuple[Any, str]:
    return fleet.answering_api()


def messages(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """SSE messages as {"event", "id"?, "data"} until the server ends the stream; keep-alives
    (`event: keepalive`) are left out, as a client listening for the task's events never sees
    them."""
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if line:
            name, _, value = line.partition(": ")
            if name in ("event", "id"):
                current[name] = value
            elif name == "data":
                current["data"] = json.loads(value)
        elif current:
            if current.get("event") != "keepalive":
                yield current
            current = {}


def open_stream(url: str, task_id: str, last_event_id: str | None = None) -> Any:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    return httpx.stream(
        "GET",
        f"{url}/api/v1/tasks/{task_id}/stream",
        headers=headers,
        timeout=httpx.Timeout(5.0, read=40.0),
    )


@pytest.mark.slow
def test_the_stream_follows_a_task_through_a_sigkill_and_resumes_after_an_api_restart(
    fleet: Fleet, pg_url: str, scripts: Path
) -> None:
    write_script(scripts, "slow", completing_turns(delay_s=4.0))
    api, url = start_api(fleet)
    fleet.sweeper()
    doomed = fleet.worker(concurrency=1)
    created = httpx.post(f"{url}/api/v1/tasks", json={"task_type": "slow", "title": "follow me"})
    task_id = created.json()["task_id"]

    # The first connection: the snapshot, generation 1's first revision, then the worker dies.
    first: list[dict[str, Any]] = []
    with open_stream(url, task_id) as response:
        assert response.status_code == 200
        for message in messages(response):
            first.append(message)
            event, data = message["event"], message["data"]
            if event == "execution_plan" and data["generation"] == 1 and doomed.poll() is None:
                Fleet.kill(doomed)  # mid-round: generation 1 is thinking before its next write
                fleet.worker(concurrency=1)  # the replacement, while the lease runs out
            if event == "status" and data["status"] == "queued":
                break  # the client drops right after recovery queued generation 2
    assert first[0]["event"] == "state"
    summary = [
        (m["event"], m.get("id"), m["data"].get("type"), m["data"]["generation"]) for m in first
    ]
    assert first[-1]["data"]["generation"] == 2, (summary, fleet.logs())

    Fleet.kill(api)  # the API restarts: only the store remembers what was sent
    api, url = start_api(fleet)
    with open_stream(url, task_id, first[-1]["id"]) as response:
        second = list(messages(response))
    assert second[0]["event"] == "state"
    assert "id" not in second[0]
    assert second[-1]["event"] == "status"
    assert second[-1]["data"]["status"] == "completed"  # and the stream ended after it

    seen = first[1:] + second[1:]
    ids = [int(m["id"]) for m in seen]
    assert ids == list(range(1, len(ids) + 1)), ids  # no gap, no repeat
    runtime, _ = runtime_for(pg_url, scripts)
    try:
        with runtime.db.transaction(readonly=True) as conn:
            logged = event_store.events_after(conn, task_id, 0, 100)
    finally:
        runtime.close()
    assert ids == [event.seq for event in logged]
    kinds = [(m["event"], m["data"]["generation"]) for m in seen]
    assert ("status", 2) in kinds
    assert ("execution_plan", 2) in kinds
    revisions = [
        m["data"]["plan"]["revision"]
        for m in seen
        if m["data"]["generation"] == 2 and m["event"] == "execution_plan"
    ]
    assert revisions == [1, 2]
