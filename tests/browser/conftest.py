"""A running console for browser tests: `orchestrator api`, a worker and the sweeper on a
SQLite store and the session's real Redis (broker, leases, plan events) with the scripted
model, and Debian's chromium driven headless by Playwright. A missing chromium skips locally
and fails when `CI` is set.

Not the filesystem broker: Kombu's filesystem transport can hand the worker a message file
still being written, and the worker then dies on a JSONDecodeError (seen here under load).

Screenshots go to `.artifacts/browser/` (git-ignored), kept after the run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from orchestrator.store.migrations import upgrade
from tests.acceptance.fleet import ORCHESTRATOR, Fleet
from tests.browser.scripts import write_scripts
from tests.services import (
    RedisServer,
    on_a_free_port,
    service_unavailable,
    wait_until_answering,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "browser"
CHROMIUM = os.environ.get("CONSOLE_TEST_CHROMIUM", "/usr/bin/chromium")
TOKEN = "browser-console-token-5f1c"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
#: ORCH_OPERATORS accounts beside the API token: name -> (role, token).
OPERATORS = {
    "vera": ("viewer", "viewer-token-9a1e"),
    "otto": ("operator", "operator-token-77c2"),
    "alma": ("approver", "approver-token-3d0b"),
}


class Console:
    """The API process (restartable on the same port) next to a worker and a sweeper."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env = env
        self.folder = folder
        self.port = 0  # chosen at the first `start_api`
        self.url = ""
        self.log_path = folder / "api.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: The fleet's sweeper: a test stops it (SIGSTOP) to see a state it would mend at once.
        self.sweeper: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(headers=HEADERS, timeout=10)

    def start_api(self) -> None:
        """Start the API: the first time on a free port (a new one if another process took it
        first), then again on that port, which the pages hold."""
        if self.port:
            self._start_api(self.port)
        else:
            on_a_free_port(self._start_api)

    def _start_api(self, port: int) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [ORCHESTRATOR, "api", "--port", str(port)],
                env=self.env,
                cwd=self.folder,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        wait_until_answering(url, self.process, self.log_path)
        self.port, self.url = port, url
        self.http.base_url = httpx.URL(url)

    def stop_api(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None

    def api_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def trigger(self, task_type: str, title: str) -> str:
        response = self.http.post("/api/v1/tasks", json={"task_type": task_type, "title": title})
        assert response.status_code == 201, response.text
        return str(response.json()["task_id"])

    def task(self, task_id: str) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_for(
        self, task_id: str, check: Callable[[dict[str, Any]], bool], timeout: float = 45
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            task = self.task(task_id)
            if check(task):
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} stayed {task['status']}: {task}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module scope: Playwright's sync API holds an event loop while it runs, which would break
    later tests that call `asyncio.run`."""
    if not Path(CHROMIUM).exists():
        service_unavailable(
            f"no chromium at {CHROMIUM} (apt-get install chromium, or `make services`)"
        )
    from playwright.sync_api import expect, sync_playwright

    # Eight test processes on two cores stretch a round from 5 s to 20: wait long, never fixed.
    expect.set_options(timeout=20_000)

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, browser: Any, redis_server: RedisServer
) -> Iterator[Console]:
    with running_console(tmp_path_factory.mktemp("console"), redis_server) as server:
        yield server


@contextmanager
def running_console(folder: Path, redis_server: RedisServer, **settings: str) -> Iterator[Console]:
    """The API, a worker (3 slots) and the sweeper (with its outbox dispatcher) on a SQLite
    store in `folder`; `settings` are more environment variables of all three (say
    ORCH_ACTIONS_URL, for a module that watches deliveries reach a backend)."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    flush = redis.Redis.from_url(redis_server.url)
    flush.flushall()
    flush.close()
    database = f"sqlite:///{folder / 'orchestrator.db'}"
    upgrade(database)
    operators = folder / "operators"
    operators.write_text(
        "".join(
            f"{name} {role} {hashlib.sha256(token.encode()).hexdigest()}\n"
            for name, (role, token) in OPERATORS.items()
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        ORCH_HOME=str(folder / "home"),
        ORCH_DATABASE_URL=database,
        ORCH_REDIS_URL=redis_server.url,
        ORCH_API_TOKEN=TOKEN,
        ORCH_OPERATORS=str(operators),
        ORCH_MODEL=f"scripted:{write_scripts(folder / 'scripts')}",
        ORCH_LEASE_SECONDS="3",
        ORCH_LEASE_RENEW_SECONDS="1",
        ORCH_SWEEP_SECONDS="1",
        ORCH_QUEUED_STALE_SECONDS="3",  # a wake-up lost by the file broker is re-sent soon
        PYTHONPATH=str(ROOT),
    )
    env.update(settings)
    fleet = Fleet(env, folder)
    server = Console(env, folder)
    try:
        worker = fleet.worker(concurrency=3)
        server.sweeper = fleet.sweeper()
        server.start_api()
        deadline = time.monotonic() + 60
        while not fleet.ready(worker):
            assert worker.poll() is None, fleet.logs()
            assert time.monotonic() < deadline, fleet.logs()
            time.sleep(0.2)
        yield server
    finally:
        server.stop_api()
        server.http.close()
        for process in fleet.processes:  # nothing to drain: a kill is quicker than a warm stop
            fleet.kill(process)
        fleet.stop()


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    """A signed-in page (by `?token=`) of 1280 x 900 CSS pixels."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(f"{console.url}/console?token={TOKEN}")
    tab.wait_for_selector("h1")
    yield tab
    context.close()
    assert not errors, errors


def shot(page: Any, name: str) -> None:
    """Keep a screenshot as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


__all__ = [
    "ARTIFACTS",
    "CHROMIUM",
    "HEADERS",
    "OPERATORS",
    "TOKEN",
    "Console",
    "running_console",
    "shot",
]
