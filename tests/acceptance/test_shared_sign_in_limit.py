"""Wrong tokens are counted in Redis when it is configured: one limit for a fleet of API processes.

The count lived in each API process's memory: N processes behind a balancer let N times the
burst through, and a restarted process forgot it. Here two real `orchestrator api` processes
share one redis-server; the guesses go to both in turn, a process is restarted, and Redis is
stopped (each process then counts on in its own memory, never without a limit).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.api.sign_in_limit import BURST, SECONDS_PER_FAILURE
from tests.acceptance.fleet import ORCHESTRATOR
from tests.services import RedisServer, on_a_free_port, wait_until_answering

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

TOKEN = "shared-limit-token-7c1d"


class Api:
    """`orchestrator api` on a port of its own, its output in `log`; `restart` keeps the port."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.port = on_a_free_port(self._start)  # a new one if another process took it first
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._start(self.port)

    def _start(self, port: int) -> int:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [ORCHESTRATOR, "api", "--port", str(port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until_answering(f"http://127.0.0.1:{port}", self.process, self.log)
        return port

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def get(self, token: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{self.url}/api/v1/tasks", headers=headers, timeout=10)


@pytest.fixture
def env(pg_url: str, redis_of_its_own: RedisServer, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    base.update(
        ORCH_HOME=str(tmp_path / "home"),
        ORCH_DATABASE_URL=pg_url,
        ORCH_REDIS_URL=redis_of_its_own.url,
        ORCH_API_TOKEN=TOKEN,
    )
    return base


@pytest.fixture
def apis(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Api, Api]]:
    first = Api(env, tmp_path / "api-a.log")
    try:
        second = Api(env, tmp_path / "api-b.log")
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


def wrong_until_refused(*apis: Api, limit: int = 3 * BURST) -> int:
    """Wrong tokens to `apis` in turn until one is refused 429: how many were answered 401."""
    for n in range(limit):
        answer = apis[n % len(apis)].get(f"guess-{n}")
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "too_many_failures"
            assert 1 <= int(answer.headers["Retry-After"]) <= SECONDS_PER_FAILURE
            return n
        assert answer.status_code == 401, answer.text
    raise AssertionError(f"{limit} wrong tokens and no 429")


def drained(since: float) -> int:
    """How many failures a bucket may have drained since `since` (monotonic), one more for luck."""
    return int((time.monotonic() - since) / SECONDS_PER_FAILURE) + 1


def test_wrong_tokens_spread_over_two_processes_and_a_restart_meet_one_limit(
    apis: tuple[Api, Api],
) -> None:
    first, second = apis
    started = time.monotonic()
    # Per process, each of the two let BURST through: 2 x BURST in all.
    answered = wrong_until_refused(first, second)
    full = time.monotonic()
    assert BURST <= answered < BURST + drained(started), answered
    for api in (first, second):  # the right token too, at either process
        assert api.get(TOKEN).status_code == 429

    # A restarted process knows the count: at most what drained meanwhile is let through (a
    # process that forgot would let a whole burst through again). The bucket was full at the
    # refusal, a little before `full`, and up to one failure short of full (it refuses the
    # one that would overflow it): one more than `drained(full)` may have drained by now.
    first.restart()
    assert wrong_until_refused(first) <= drained(full) < BURST
    for api in (first, second):
        text = api.log.read_text()
        assert "guess-" not in text
        assert TOKEN not in text


def test_with_redis_stopped_each_process_still_holds_to_its_own_count(
    apis: tuple[Api, Api], redis_of_its_own: RedisServer
) -> None:
    first, second = apis
    started = time.monotonic()
    for n in range(5):
        assert first.get(f"early-{n}").status_code == 401
    redis_of_its_own.stop()
    # Counted on in this process's memory, from the failures it saw: never without a limit,
    # never a 500.
    answered = wrong_until_refused(first)
    assert BURST - 5 <= answered < BURST - 5 + drained(started), answered
    assert first.get(TOKEN).status_code == 429
    # The other process saw none of them: its own burst.
    assert wrong_until_refused(second) >= BURST - drained(started)
    text = first.log.read_text()
    lines = [line for line in text.splitlines() if "sign-in" in line and "Redis" in line]
    assert len(lines) == 1, text  # once per outage, not per request
    assert "Traceback" not in text, text

    # Redis back (empty): it is asked again, and this process's own count still holds (an
    # empty Redis alone would let a whole burst through again).
    redis_of_its_own.start()
    deadline = time.monotonic() + 15
    meanwhile = 0
    while "answers again" not in first.log.read_text():
        status = first.get(f"meanwhile-{meanwhile}").status_code
        assert status in (401, 429)
        meanwhile += status == 401
        assert time.monotonic() < deadline, first.log.read_text()
        time.sleep(0.1)
    counted = 5 + answered + meanwhile + wrong_until_refused(first)
    # A leaky bucket never lets more through than its burst and what drained since it began.
    assert counted < BURST + drained(started), counted
