"""`orchestrator api` logs in ORCH_LOG_FORMAT, and a token in a URL never reaches a line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.acceptance.fleet import ORCHESTRATOR, answering_api_on
from tests.services import on_a_free_port, refused_port

SECRET = "query-token-5a4b3c2d1e0f9a8b"


@contextmanager
def running_api(tmp_path: Path, env: dict[str, str]) -> Iterator[int]:
    """`orchestrator api` on a free port (a new one if another process took it first), once it
    answers, its output in `tmp_path/api.log`: its port; stopped on leaving."""
    path = tmp_path / "api.log"

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        return answering_api_on(port, env, path), port

    api, port = on_a_free_port(start)
    try:
        yield port
    finally:
        api.terminate()
        # A clean stop on SIGTERM is exit 0 (tests/acceptance/test_api_shutdown.py).
        assert api.wait(timeout=20) == 0


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_api_access_lines_are_masked(tmp_path: Path, log_format: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(tmp_path / "home"), "ORCH_LOG_FORMAT": log_format})
    assert subprocess.run([ORCHESTRATOR, "db", "upgrade"], env=env, timeout=60).returncode == 0
    with running_api(tmp_path, env) as port:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{port}/api/v1/tasks?token={SECRET}"
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
                time.sleep(0.2)
        time.sleep(0.5)  # the last lines are written
    text = (tmp_path / "api.log").read_text()
    assert SECRET not in text
    assert "Logging error" not in text, text
    assert "Traceback" not in text, text
    access = [line for line in text.splitlines() if "/api/v1/tasks?token=" in line]
    assert len(access) == 1, text
    if log_format == "json":
        line = json.loads(access[0])
        assert line["logger"] == "uvicorn.access"
        assert line["level"] == "info"


TOKEN = "api-token-0f1e2d3c4b5a6978"


def test_the_apis_own_lines_are_formatted_and_masked_in_text(tmp_path: Path) -> None:
    """In text format the orchestrator's lines of the API (here: the store is down) carry time,
    level and logger, as the worker's and the sweeper's do, and are masked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        {
            "ORCH_HOME": str(tmp_path / "home"),
            "ORCH_API_TOKEN": TOKEN,
            "ORCH_DATABASE_URL": f"postgresql+psycopg://orch:pw@127.0.0.1:{refused_port()}/orch",
        }
    )
    with running_api(tmp_path, env) as port:
        deadline = time.monotonic() + 30
        while True:
            # A path that repeats a secret (a token pasted where an id belongs).
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/tasks/{TOKEN}",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            try:
                urllib.request.urlopen(request, timeout=5)
            except urllib.error.HTTPError as exc:
                status = exc.code
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
                time.sleep(0.2)
        time.sleep(0.5)  # the last lines are written
    text = (tmp_path / "api.log").read_text()
    assert status == 503, text
    assert TOKEN not in text, text
    lines = [line for line in text.splitlines() if "store unavailable" in line]
    assert len(lines) == 1, text
    assert re.match(r"\d{4}-\d\d-\d\d [\d:,]+ WARNING orchestrator\.api\.app: ", lines[0]), text
