"""The limit on wrong tokens kept in Redis (`SharedFailedSignIns`): its rules, keys and outages.

tests/acceptance/test_shared_sign_in_limit.py runs two API processes on one Redis; here the
limit is asked directly, against a real redis-server, for what those cannot see quickly.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn

from orchestrator.api import create_app, shared_sign_ins
from orchestrator.api.shared_sign_ins import SOCKET_TIMEOUT_SECONDS, SharedFailedSignIns
from orchestrator.api.sign_in_limit import (
    BURST,
    SECONDS_PER_FAILURE,
    WIDE,
    TooManyFailures,
    client_address,
)
from orchestrator.leases.keys import SIGN_IN_PREFIX
from orchestrator.settings import load_settings
from tests.services import RedisServer, bound_socket

pytestmark = pytest.mark.redis


@pytest.fixture
def shared(redis_url: str) -> Iterator[SharedFailedSignIns]:
    limit = SharedFailedSignIns(redis_url)
    yield limit
    limit.close()


def guesses(limit: SharedFailedSignIns, addresses: list[str], tries: int) -> int:
    """Wrong tokens from `addresses` in turn, `tries` of them: how many were counted (not 429)."""
    counted = 0
    for n in range(tries):
        try:
            limit.attempt(addresses[n % len(addresses)], wrong=True)
        except TooManyFailures:
            continue
        counted += 1
    return counted


def test_a_48_cycling_through_its_64s_is_held_up_across_processes(redis_url: str) -> None:
    """Two processes (two limits on one Redis) share the /48's bucket: WIDE times the burst in
    all, whichever process each /64 guessed at."""
    one, two = SharedFailedSignIns(redis_url), SharedFailedSignIns(redis_url)
    try:
        sixty_fours = [client_address((f"2001:db8:7:{n:x}::1", 1)) for n in range(200)]
        counted = 0
        for n in range(BURST * WIDE + 100):
            limit = one if n % 2 else two
            try:
                limit.attempt(sixty_fours[n % 200], wrong=True)
            except TooManyFailures:
                continue
            counted += 1
        assert BURST * WIDE <= counted <= BURST * WIDE + 2  # what drained meanwhile
        # Another /48 is not held up, nor is a right token counted as a guess.
        one.attempt(client_address(("2001:db8:8::1", 1)), wrong=False)
        with pytest.raises(TooManyFailures):
            two.attempt(client_address(("2001:db8:7:ffff::1", 1)), wrong=False)
    finally:
        one.close()
        two.close()


def test_each_bucket_is_one_key_that_expires_as_it_drains(
    shared: SharedFailedSignIns, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        shared.attempt("203.0.113.7", wrong=False)  # a right token: nothing to keep
        assert client.keys(f"{SIGN_IN_PREFIX}*") == []
        shared.attempt("203.0.113.7", wrong=True)
        shared.attempt("203.0.113.7", wrong=True)
        key = f"{SIGN_IN_PREFIX}203.0.113.7"
        assert client.keys(f"{SIGN_IN_PREFIX}*") == [key.encode()]
        # Two failures drain in twice SECONDS_PER_FAILURE: the key goes then.
        assert 0 < client.pttl(key) <= 2 * SECONDS_PER_FAILURE * 1000
        assert client.pttl(key) > (2 * SECONDS_PER_FAILURE - 1) * 1000
        shared.attempt(client_address(("2001:db8:1:2::5", 1)), wrong=True)
        assert {k.decode() for k in client.keys(f"{SIGN_IN_PREFIX}2001*")} == {
            f"{SIGN_IN_PREFIX}2001:db8:1:2::/64",
            f"{SIGN_IN_PREFIX}2001:db8:1::/48",
        }
        # The /48 drains WIDE times faster.
        assert client.pttl(f"{SIGN_IN_PREFIX}2001:db8:1::/48") <= SECONDS_PER_FAILURE * 1000 / WIDE
    finally:
        client.close()


def test_a_redis_that_restarts_empty_does_not_lift_this_processs_count(
    redis_of_its_own: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    limit = SharedFailedSignIns(redis_of_its_own.url, retry_seconds=0)
    try:
        assert guesses(limit, ["192.0.2.1"], BURST + 5) == BURST
        redis_of_its_own.restart()  # its keys lost, its scripts too
        with caplog.at_level(logging.INFO):
            with pytest.raises(TooManyFailures):
                limit.attempt("192.0.2.1", wrong=False)
            limit.attempt("192.0.2.2", wrong=True)  # Redis counts again (the script re-loaded)
        client = redis.Redis.from_url(redis_of_its_own.url)
        assert client.keys(f"{SIGN_IN_PREFIX}*") == [f"{SIGN_IN_PREFIX}192.0.2.2".encode()]
        client.close()
    finally:
        limit.close()


def test_a_redis_that_hangs_holds_a_check_up_once_then_this_process_counts_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that takes connections and never answers: the first check waits out the socket
    timeout (once: a timeout is not tried again), the next ones, for RETRY_SECONDS, not at all;
    the count goes on in this process and the outage is one log line."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # never accepted: a connection is made, nothing is ever answered
    limit = SharedFailedSignIns(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    try:
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            limit.attempt("192.0.2.9", wrong=True)
            assert time.monotonic() - started < SOCKET_TIMEOUT_SECONDS + 0.4
            started = time.monotonic()
            assert guesses(limit, ["192.0.2.9"], BURST + 5) == BURST - 1
            assert time.monotonic() - started < 0.5
        lines = [r for r in caplog.records if r.name == "orchestrator.api.shared_sign_ins"]
        assert len(lines) == 1, caplog.text
        assert "Redis does not answer" in lines[0].getMessage()
    finally:
        limit.close()
        silent.close()


def test_a_redis_that_hangs_holds_up_the_request_that_asks_it_not_the_api(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The middleware asks Redis on a worker thread: while one request with a token waits out
    the socket timeout (4 s here), the event loop answers others (a health check) at once
    (within half of it: 2 s was 1 s, which a full run's load once took up with 1.15 s)."""
    hang = 4.0
    monkeypatch.setattr(shared_sign_ins, "SOCKET_TIMEOUT_SECONDS", hang)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    settings = load_settings(
        database_url=sqlite_url,
        home=tmp_path,
        redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
        api_token="hang-token-1234",
    )
    sock = bound_socket()  # its port cannot be taken by another process before uvicorn listens
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        answers: list[int] = []

        def signed_in() -> None:
            headers = {"Authorization": "Bearer hang-token-1234"}
            answers.append(
                httpx.get(f"{url}/api/v1/tasks", headers=headers, timeout=10).status_code
            )

        waiting = threading.Thread(target=signed_in)
        started = time.monotonic()
        waiting.start()
        time.sleep(0.1)  # the request is in, waiting on Redis
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert time.monotonic() - started < hang / 2
        waiting.join(timeout=10)
        assert answers == [200]  # this process's count let it through
        assert time.monotonic() - started >= hang  # it did wait on Redis
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        silent.close()


def test_a_redis_that_refuses_the_count_is_said_to_refuse_not_to_be_down(
    redis_of_its_own: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis full under `noeviction` answers, and refuses the script's write: the one warning
    says so (not "does not answer", which sends an operator to the network), and this process's
    own count still holds the address to the limit."""
    client = redis.Redis.from_url(redis_of_its_own.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # any write is now refused: OOM
    limit = SharedFailedSignIns(redis_of_its_own.url, retry_seconds=0)
    try:
        with caplog.at_level(logging.WARNING, logger=shared_sign_ins.__name__):
            counted = guesses(limit, ["203.0.113.9"], BURST + 5)
        assert counted == BURST  # this process's count: no more than one burst
        lines = [r.getMessage() for r in caplog.records if r.name == shared_sign_ins.__name__]
        assert len(lines) == 1, lines
        assert "answers but refused the sign-in count" in lines[0], lines[0]
        assert "OutOfMemoryError" in lines[0], lines[0]
        assert "does not answer" not in lines[0]
    finally:
        limit.close()
        client.config_set("maxmemory", "0")
        client.close()
