"""The servers the tests start (`tests/services.py`) survive a port taken between the moment
`free_port()` found it free and the moment they bind it: on a busy machine another process may
take it first. Before, Postgres failed the session ("Address already in use"), and Redis was
worse: its fixture waited for *a* server to answer on the port, found the other one, and the
tests ran against it (the `redis_url` fixture empties it). Now the start is tried again on a
new port, a few times, when the server says the address is in use."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from orchestrator.store import migrations
from tests import services
from tests.acceptance.fleet import Fleet
from tests.executions_support import completing_turns, write_script
from tests.integration.test_metrics import metrics_worker, scrape
from tests.services import PostgresServer, RedisServer, free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on (and never answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.slow  # two clusters made and started: 15 s on a loaded machine
def test_postgres_starts_on_another_port_when_its_port_was_taken(
    postgres: PostgresServer, taken_port: int
) -> None:
    for taken in (postgres.port, taken_port):  # another Postgres; another program
        server = PostgresServer(port=taken)
        try:
            server.start()
            assert server.port != taken
            with server.connect() as conn:
                row = conn.execute("SELECT inet_server_port()").fetchone()
            assert row is not None
            assert row[0] == server.port
        finally:
            server.stop()


def test_redis_starts_on_another_port_and_never_takes_the_server_there_for_its_own(
    redis_of_its_own: RedisServer, taken_port: int
) -> None:
    other = redis.Redis.from_url(redis_of_its_own.url)
    other.set("theirs", "1")
    for taken in (redis_of_its_own.port, taken_port):  # another Redis; another program
        server = RedisServer(port=taken)
        try:
            server.start()
            assert server.port != taken
            assert server.process is not None
            assert server.process.poll() is None
            mine = redis.Redis.from_url(server.url)
            assert mine.info("server")["process_id"] == server.process.pid
            assert mine.get("theirs") is None
            mine.close()
        finally:
            server.close()
    assert other.get("theirs") == b"1"
    other.close()


def test_a_redis_started_again_keeps_its_port(redis_of_its_own: RedisServer) -> None:
    port = redis_of_its_own.port
    for again in (redis_of_its_own.restart, redis_of_its_own.stop, redis_of_its_own.start):
        again()
        assert redis_of_its_own.port == port
    assert redis_of_its_own.process is not None
    client = redis.Redis.from_url(redis_of_its_own.url)
    assert client.info("server")["process_id"] == redis_of_its_own.process.pid
    client.close()


def test_a_redis_started_again_on_a_port_taken_meanwhile_says_so(
    redis_of_its_own: RedisServer,
) -> None:
    redis_of_its_own.stop()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its TIME_WAITs
        sock.bind(("127.0.0.1", redis_of_its_own.port))
        sock.listen()
        with pytest.raises(RuntimeError, match="did not start again on port"):
            redis_of_its_own.start()


def test_an_api_process_starts_again_on_a_new_port_when_its_port_was_taken(
    tmp_path: Path, sqlite_url: str, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API processes the tests start (`Fleet.answering_api`, the console's, the stream
    tests') exit at start with one line when their port is in use: started again elsewhere."""
    ports = iter([taken_port])
    monkeypatch.setattr(services, "free_port", lambda: next(ports, None) or free_port())
    fleet = Fleet({"ORCH_DATABASE_URL": sqlite_url, "ORCH_HOME": str(tmp_path)}, tmp_path)
    try:
        process, url = fleet.answering_api()
        assert url != f"http://127.0.0.1:{taken_port}"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert [p.pid for p in fleet.processes] == [fleet.processes[0].pid, process.pid]
        first = fleet.log_of(fleet.processes[0]).read_text()
        assert services.says_port_taken(first, taken_port), first
    finally:
        fleet.stop()


def test_a_worker_serving_metrics_starts_again_on_a_new_port_when_its_port_was_taken(
    tmp_path: Path, scripts: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orchestrator worker` stops at start with one line when ORCH_METRICS_PORT is in use."""
    home = tmp_path / "home"
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    write_script(scripts, "good", completing_turns())
    ports = iter([taken_port])
    monkeypatch.setattr(services, "free_port", lambda: next(ports, None) or free_port())
    with metrics_worker(tmp_path, home, scripts, 1) as (worker, _env, port):
        assert port != taken_port
        assert worker.poll() is None
        assert "orchestrator_worker_slots 1.0" in scrape(port)
    assert services.says_port_taken((tmp_path / "worker.log").read_text(), taken_port)


def test_a_refused_port_refuses_and_cannot_be_taken() -> None:
    """A store or Redis that is down in a test is a port where a connection is refused: held,
    so no other process's server can start there and answer instead (it could on a port that
    `free_port()` found free)."""
    port = services.refused_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))
