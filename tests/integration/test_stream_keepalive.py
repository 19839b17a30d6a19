"""An idle stream's keep-alive is an event a browser's `EventSource` surfaces: `event: keepalive`,
every ORCH_STREAM_KEEPALIVE_SECONDS, without an id. It was an SSE comment (`: keep-alive`), which
an `EventSource` never dispatches, so the console could not tell a quiet stream from an API that
stopped answering, and kept showing it live."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api import create_app
from orchestrator.settings import SettingsError, load_settings
from tests.sse_support import parse

EVERY = 0.3
TRIGGER = {"task_type": "t", "title": "Quiet for a while", "context": {}}


def blocks(lines: Iterator[str]) -> Iterator[tuple[float, str]]:
    """Each SSE message (its lines, comments included) with the time it was read in full."""
    block: list[str] = []
    for line in lines:
        if line:
            block.append(line)
        elif block:
            yield time.monotonic(), "\n".join(block) + "\n\n"
            block = []


@pytest.mark.parametrize("stream", ["task", "plan"])
def test_an_idle_stream_sends_a_keepalive_event_at_its_interval(
    sqlite_url: str, tmp_path: Path, stream: str
) -> None:
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, stream_keepalive_seconds=EVERY
    )
    with TestClient(create_app(settings)) as client:
        task = client.post("/api/v1/tasks", json=TRIGGER).json()
        url = (
            f"/api/v1/tasks/{task['task_id']}/stream"
            if stream == "task"
            else f"/api/v1/agent/chat/session/{task['session_id']}/stream"
        )
        with client.stream("GET", url) as response:
            assert response.status_code == 200
            read = blocks(response.iter_lines())
            opened, first = next(read)
            [state] = parse(first)
            assert state["event"] == "state"
            # Every connection says at once how long it may be silent.
            assert state["data"]["keepalive_seconds"] == EVERY
            keepalives = [next(read) for _ in range(3)]
    texts = [text for _, text in keepalives]
    # A named event with data (an event with no data is never dispatched), and no id: a
    # browser's reconnect still says the last real event it saw.
    assert texts == ['event: keepalive\ndata: {"keepalive_seconds":0.3}\n\n'] * 3
    assert parse(texts[0]) == [{"event": "keepalive", "data": {"keepalive_seconds": EVERY}}]
    times = [opened] + [at for at, _ in keepalives]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # At the interval: not more often (a busy machine may make one late, never early).
    assert all(gap >= EVERY * 0.8 for gap in gaps), gaps
    assert times[-1] - opened < 3 * EVERY + 5, gaps


def test_the_keepalive_interval_is_a_setting_with_bounds(tmp_path: Path) -> None:
    assert load_settings(home=tmp_path).stream_keepalive_seconds == 10
    for wrong in ("0", "0.01", "301", "soon"):
        with pytest.raises(SettingsError, match="ORCH_STREAM_KEEPALIVE_SECONDS"):
            load_settings(home=tmp_path, stream_keepalive_seconds=wrong)
