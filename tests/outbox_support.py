"""Outbox tests' helpers: a task waiting on a work order, and a business backend on loopback
that records what arrives and can fail.

`answers` lists the statuses of the next requests, one each, before anything else (a 2xx takes
the request); `fail_first` answers `fail_status` (503 unless set) to that many requests first,
`always_fail` to every request, each failure with the `fail_headers` (a `Retry-After`, say);
`delay_seconds` holds the answers (to the `slow_path` only, when set) until `release` is set:
for killing a dispatcher mid-send; `body_delay_seconds` sends the status and headers at once
and the body that much later. Actions are applied once per `Idempotency-Key`, as a backend
that honours the key would: `applied` lists each key once, `received` every request.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store.types import utcnow
from tests.executions_support import node, plan_call, report_call, runtime_for, write_script

__all__ = [
    "Received",
    "Recorder",
    "approved_action",
    "cli_on",
    "outbox_runtime",
    "running_recorder",
    "slow_dispatcher",
    "until_a_statement_waits_for_a_lock",
    "waiting_task",
]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Recorder:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    fail_first: int = 0
    always_fail: bool = False
    fail_status: int = 503
    fail_headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    slow_path: str | None = None
    body_delay_seconds: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
            with recorder.lock:
                recorder.received.append(got)
                if recorder.answers:
                    status = recorder.answers.pop(0)
                    failing = not 200 <= status < 300
                else:
                    failing = recorder.always_fail or recorder.fail_first > 0
                    if recorder.fail_first > 0:
                        recorder.fail_first -= 1
                    status = recorder.fail_status if failing else 200
                key = got.headers.get("idempotency-key")
                if not failing and key and key not in recorder.applied:
                    recorder.applied.append(key)
            recorder.arrived.set()
            if recorder.delay_seconds and recorder.slow_path in (None, got.path):
                recorder.release.wait(recorder.delay_seconds)
            self.send_response(status)
            for name, value in (recorder.fail_headers if failing else {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            if recorder.body_delay_seconds:
                time.sleep(recorder.body_delay_seconds)
            with contextlib.suppress(OSError):  # the dispatcher may have hung up meanwhile
                self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def outbox_runtime(
    store_url: str,
    folder: Path,
    backend: Recorder,
    *,
    webhook_secret: str,
    actions_secret: str,
    **settings: Any,
) -> Iterator[Runtime]:
    """A runtime that delivers actions and webhooks to `backend`, retrying fast."""
    runtime, _ = runtime_for(
        store_url,
        folder / "scripts",
        actions_url=f"{backend.url}/actions",
        actions_secret=actions_secret,
        webhook_url=f"{backend.url}/hooks",
        webhook_secret=webhook_secret,
        outbox_backoff_seconds=0.01,
        outbox_timeout_seconds=2,
        webhook_max_attempts=3,
        **settings,
    )
    try:
        yield runtime
    finally:
        runtime.close()


@contextmanager
def running_recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    server.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: shutdown() waits up to one poll interval (0.5 s by default) per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.release.set()
        server.shutdown()
        server.server_close()


def waiting_task(rt: Runtime, tmp_path: Path) -> tuple[str, str]:
    """A task whose generation 1 proposed a work order and waits for it: (task, action)."""
    write_script(
        tmp_path / "scripts",
        "act",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {
                "tool_calls": [
                    {
                        "id": "c2",
                        "name": "propose_action",
                        "arguments": {
                            "node_id": "repair",
                            "kind": "work_order",
                            "payload": {"crew": "north"},
                        },
                    }
                ]
            },
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="act", title="Burst main")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").ran
    view = rt.tasks.explain(task_id)
    assert view["status"] == "waiting"
    return task_id, view["pending_actions"][0]["action_id"]


def slow_dispatcher(rt: Runtime) -> OutboxDispatcher:
    """A dispatcher whose failed attempts back off for minutes, as a production one's do, and
    that waits for an answer long enough for a test to look at a row while it is sent."""
    settings = rt.settings.model_copy(
        update={
            "outbox_backoff_seconds": 300.0,
            "outbox_backoff_max_seconds": 3600.0,
            "outbox_timeout_seconds": 30.0,
        }
    )
    return OutboxDispatcher(settings, rt.db)


def cli_on(monkeypatch: pytest.MonkeyPatch, store_url: str, tmp_path: Path) -> None:
    """The CLI's settings pointed at the test's store."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))


def until_a_statement_waits_for_a_lock(rt: Runtime) -> None:
    """Returns once a session of the store (Postgres) waits for a row lock (a racing write)."""
    deadline = utcnow().timestamp() + 10
    while utcnow().timestamp() < deadline:
        with rt.db.transaction(readonly=True) as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        if waiting:
            return
        threading.Event().wait(0.01)
    raise AssertionError("no statement waited for the claim's lock")


def approved_action(rt: Runtime, tmp_path: Path) -> tuple[str, str]:
    """A waiting task whose work order a duty engineer approved: (task, action)."""
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="duty engineer", note=None, digest=digest)
    return task_id, action_id
