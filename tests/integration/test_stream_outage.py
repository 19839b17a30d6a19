"""An open stream through a Postgres outage: the task stream and the plan stream stay open, send
keep-alives while the store is away, and go on with the events committed after it is back, with
one warning in the API's log and no traceback (a business backend following a task must not
lose its stream, or read 400 lines of traceback per stream, because the store restarted)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from tests.executions_support import settings_for
from tests.integration.test_task_stream import next_status
from tests.services import PostgresServer


def lines_until(lines: Iterator[str], wanted: str) -> list[str]:
    """Read SSE lines up to and including `wanted`; the lines read."""
    seen = []
    for line in lines:
        seen.append(line)
        if line == wanted:
            return seen
    raise AssertionError(f"the stream ended before {wanted!r}: {seen}")


def test_the_task_stream_stays_open_through_a_store_outage_and_goes_on(
    pg_url: str, postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(pg_url, tmp_path / "scripts", task_stream_poll_seconds=0.05)
    app = create_app(settings, keepalive_seconds=0.2)
    with TestClient(app) as client:
        task_id = client.post("/api/v1/tasks", json={"task_type": "x", "title": "t"}).json()[
            "task_id"
        ]
        with client.stream("GET", f"/api/v1/tasks/{task_id}/stream") as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            lines_until(lines, "event: state")
            with caplog.at_level(logging.INFO, logger="orchestrator"):
                postgres.stop_for(1.0)  # the stream reads every 0.05 s meanwhile
                # Kept alive while the store was away (or right after): not ended.
                lines_until(lines, "event: keepalive")
                answer = client.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "stop"})
                assert answer.status_code == 200, answer.text
                status = next_status(lines)
    assert status["status"] == "cancelled"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    warned = [
        r.getMessage() for r in caplog.records if "the store is unavailable" in r.getMessage()
    ]
    assert len(warned) == 1, warned  # one line per outage, not one per read
    assert task_id in warned[0]
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_the_plan_stream_stays_open_through_a_store_outage_and_goes_on(
    pg_url: str, postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(pg_url, tmp_path / "scripts", agent_internal_token="internal-token")
    app = create_app(settings, keepalive_seconds=0.2)
    with TestClient(app) as client:
        made = client.post("/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "c"})
        session_id = made.json()["session_id"]
        url = f"/api/v1/agent/chat/session/{session_id}/stream"
        with client.stream("GET", url) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            lines_until(lines, "event: state")
            with caplog.at_level(logging.INFO, logger="orchestrator"):
                postgres.stop_for(1.0)
                lines_until(lines, "event: keepalive")
                answer = client.post(
                    f"/api/v1/internal/sessions/{session_id}/execution-plans",
                    json={"request_id": "r1", "title": "plan", "reason": "", "nodes": [NODE]},
                    headers={"Authorization": "Bearer internal-token"},
                )
                assert answer.status_code == 201, answer.text
                seen = lines_until(lines, "event: execution_plan")
    assert seen[-1] == "event: execution_plan"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert any(session_id in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


NODE = {"id": "a", "title": "step a", "actor": "agent", "status": "pending"}
