"""The live plan stream with real processes: `orchestrator api` under uvicorn, a publisher in
another process, embedded (SQLite, polling) and distributed (Postgres, Redis pub/sub)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services import on_a_free_port, wait_until_answering

ROOT = Path(__file__).resolve().parents[2]
API_TOKEN = "acceptance-public"
INTERNAL_TOKEN = "acceptance-internal"
HEADERS = {"Authorization": f"Bearer {API_TOKEN}"}

PUBLISHER = """
import json, sys
from orchestrator.events import make_notifier
from orchestrator.services.plans import PlanService
from orchestrator.settings import load_settings
from orchestrator.store import Database

settings = load_settings()
db = Database.from_url(settings.store_url)
result = PlanService(db, make_notifier(settings)).publish_execution_plan(
    sys.argv[1], json.loads(sys.argv[2])
)
print(result.plan.revision)
db.dispose()
"""


def plan(request_id: str, ids: list[str]) -> dict[str, Any]:
    nodes = [{"id": i, "title": f"step {i}", "actor": "agent", "status": "pending"} for i in ids]
    return {"request_id": request_id, "title": "plan", "reason": "", "nodes": nodes, "edges": []}


class Api:
    """`orchestrator api` as a child process."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.port = on_a_free_port(partial(self._start, log))  # a new one if another took it
        self.url = f"http://127.0.0.1:{self.port}"

    def _start(self, log: Path, port: int) -> int:
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "api", "--port", str(port)],
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_answering(f"http://127.0.0.1:{port}", self.process, log)
        except AssertionError:
            self.stop()
            raise
        return port

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self._log.close()


class Stream:
    """An open SSE connection read by a thread; events arrive on a queue as dicts."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.status: int | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(5, read=60))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, headers), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _read(self, url: str, headers: dict[str, str]) -> None:
        try:
            with self._client.stream("GET", url, headers=headers) as response:
                self.status = response.status_code
                self.content_type = response.headers.get("content-type", "")
                self._ready.set()
                event: dict[str, Any] = {}
                for line in response.iter_lines():
                    if line == "":
                        if event:
                            self.events.put(event)
                        event = {}
                    elif line.startswith(":"):
                        self.events.put({"comment": line})
                    else:
                        field, _, value = line.partition(":")
                        event[field] = value.removeprefix(" ")
        except (httpx.HTTPError, RuntimeError):
            pass  # closed by the test
        finally:
            self._ready.set()

    def next(self, timeout: float = 10) -> dict[str, Any]:
        while True:
            event = self.events.get(timeout=timeout)
            # A keep-alive (a comment before, an event of its own now) is no plan news.
            if "comment" not in event and event.get("event") != "keepalive":
                return {**event, "data": json.loads(event["data"])}

    def close(self) -> None:
        self._client.close()


@pytest.fixture(params=["embedded", "redis"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    base.update(
        ORCH_HOME=str(tmp_path / "home"),
        ORCH_API_TOKEN=API_TOKEN,
        AGENT_INTERNAL_TOKEN=INTERNAL_TOKEN,
        PYTHONPATH=str(ROOT),
    )
    if request.param == "embedded":
        base["ORCH_DATABASE_URL"] = str(request.getfixturevalue("sqlite_url"))
    else:
        base["ORCH_DATABASE_URL"] = str(request.getfixturevalue("pg_url"))
        base["ORCH_REDIS_URL"] = str(request.getfixturevalue("redis_url"))
    return base


@pytest.fixture
def api(env: dict[str, str], tmp_path: Path) -> Iterator[Api]:
    server = Api(env, tmp_path / "api.log")
    yield server
    server.stop()


def publish_elsewhere(env: dict[str, str], session_id: str, body: dict[str, Any]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PUBLISHER, session_id, json.dumps(body)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


def new_session(api: Api) -> str:
    response = httpx.post(
        f"{api.url}/api/v1/sessions",
        json={"purpose": "ordinary_chat", "title": "watch"},
        headers=HEADERS,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


@pytest.mark.slow
def test_state_first_then_revisions_from_another_process(api: Api, env: dict[str, str]) -> None:
    session_id = new_session(api)
    stream = Stream(f"{api.url}/api/v1/agent/chat/session/{session_id}/stream", HEADERS)
    try:
        assert stream.status == 200
        assert stream.content_type.startswith("text/event-stream")
        first = stream.next()
        assert first["event"] == "state"
        assert first["data"] == {
            "session_id": session_id,
            "running": False,
            "execution_plans": [],
            "keepalive_seconds": 10.0,
        }

        started = time.monotonic()
        assert publish_elsewhere(env, session_id, plan("r1", ["a"])) == 1
        # Promptly: the embedded poll is 0.5 s, Redis wakes at once (its 5 s fallback poll
        # would usually miss this; tests/integration/test_plan_events.py proves the pub/sub).
        event = stream.next(timeout=3)
        assert (event["event"], event["id"]) == ("execution_plan", "1")
        assert event["data"]["revision"] == 1
        assert event["data"]["schema_version"] == "execution-plan@1"
        assert [n["id"] for n in event["data"]["nodes"]] == ["a"]

        publish_elsewhere(env, session_id, plan("r2", ["a", "b"]))
        publish_elsewhere(env, session_id, plan("r2", ["a", "b"]))  # replay: no new event
        publish_elsewhere(env, session_id, plan("r3", ["a", "b", "c"]))
        ids = [stream.next()["id"], stream.next()["id"]]
        assert ids == ["2", "3"]
        assert time.monotonic() - started < 30
        with pytest.raises(queue.Empty):
            stream.next(timeout=1.5)  # nothing twice, nothing for the replay
    finally:
        stream.close()


@pytest.mark.slow
def test_last_event_id_replays_what_was_missed(api: Api, env: dict[str, str]) -> None:
    session_id = new_session(api)
    for index in range(1, 4):
        publish_elsewhere(env, session_id, plan(f"r{index}", [f"n{i}" for i in range(index)]))
    url = f"{api.url}/api/v1/agent/chat/session/{session_id}/stream"
    fresh = Stream(url, HEADERS)
    try:
        state = fresh.next()
        assert state["event"] == "state"
        assert [p["revision"] for p in state["data"]["execution_plans"]] == [3]
        with pytest.raises(queue.Empty):
            fresh.next(timeout=1)
    finally:
        fresh.close()

    resumed = Stream(url, {**HEADERS, "Last-Event-ID": "1"})
    try:
        assert resumed.next()["event"] == "state"
        assert [resumed.next()["id"], resumed.next()["id"]] == ["2", "3"]
        publish_elsewhere(env, session_id, plan("r4", ["n0", "n1", "n2", "n3"]))
        live = resumed.next()
        assert (live["event"], live["id"]) == ("execution_plan", "4")
    finally:
        resumed.close()


@pytest.mark.slow
def test_the_stream_needs_the_token_and_a_known_session(api: Api) -> None:
    url = f"{api.url}/api/v1/agent/chat/session/nope/stream"
    assert httpx.get(url).status_code == 401
    missing = httpx.get(url, headers=HEADERS)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_api_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "api", "--host", "0.0.0.0", "--port", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "ORCH_API_TOKEN" in done.stderr


def test_plans_show_prints_a_tree_with_counts(sqlite_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(tmp_path), ORCH_DATABASE_URL=sqlite_url, PYTHONPATH=str(ROOT))
    create = (
        "from orchestrator.services.sessions import SessionService\n"
        "from orchestrator.store import Database\n"
        f"print(SessionService(Database.from_url({sqlite_url!r}))"
        ".create_session(purpose='ordinary_chat', title='t').session_id)"
    )
    session_id = subprocess.run(
        [sys.executable, "-c", create], env=env, cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    body = plan("r1", ["collect", "sample", "scada", "report"])
    body["nodes"][0].update(status="completed", evidence="complaint #12")
    body["nodes"][1].update(actor="human", status="waiting", reason="crew on site at 14:00")
    body["edges"] = [
        {"from": "collect", "to": "sample", "label": "turbid"},
        {"from": "collect", "to": "scada"},
        {"from": "sample", "to": "report"},
        {"from": "scada", "to": "report"},
    ]
    publish_elsewhere(env, session_id, body)
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plans", "show", session_id],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "revision 1" in shown
    assert "status: pending 2, waiting 1, completed 1" in shown
    lines = shown.splitlines()
    assert any(line.startswith("[completed] collect") for line in lines)
    assert any("├─ <turbid> [waiting] sample" in line for line in lines)
    assert sum("[pending] report" in line for line in lines) == 1
    assert any("-> report (shown above)" in line for line in lines)
    as_json = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plans", "show", session_id, "--json"],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(as_json)["revision"] == 1
