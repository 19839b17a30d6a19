"""`/readyz`: the store answers a query and Redis a PING, each within a short timeout; otherwise
503 naming the part that failed (no secret, no traceback). `/healthz` stays liveness only."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.api.readiness import READY_TIMEOUT_SECONDS
from orchestrator.settings import load_settings
from tests.services import refused_port

PASSWORD = "pg-pa55word-for-readyz"
TOKEN = "api-token-for-readyz-0123"


def client_for(tmp_path: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(load_settings(home=tmp_path, api_token=TOKEN, **settings)))


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers (a host that hangs)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def test_ready_with_postgres_and_redis_and_open_without_the_token(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    with client_for(tmp_path, database_url=pg_url, redis_url=redis_url) as client:
        response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"store": "ok", "redis": "ok"}}


def test_ready_embedded_checks_the_sqlite_store_only(sqlite_url: str, tmp_path: Path) -> None:
    with client_for(tmp_path, database_url=sqlite_url) as client:
        response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"store": "ok"}}


def test_a_store_and_a_redis_that_are_down_are_named_in_a_503(
    tmp_path: Path, redis_url: str
) -> None:
    store = f"postgresql+psycopg://orch:{PASSWORD}@127.0.0.1:{refused_port()}/orch"
    redis_down = f"redis://:{PASSWORD}@127.0.0.1:{refused_port()}/0"
    with client_for(tmp_path, database_url=store, redis_url=redis_down) as client:
        response = client.get("/readyz")
        assert client.get("/healthz").status_code == 200  # liveness does not look at them
    assert response.status_code == 503
    assert response.headers["retry-after"]
    body = response.json()
    assert body["error"]["code"] == "not_ready"
    failed = {detail["field"]: detail for detail in body["error"]["details"]}
    assert set(failed) == {"store", "redis"}
    assert failed["store"]["code"] == "store_unavailable"
    assert failed["redis"]["code"] == "redis_unavailable"
    assert PASSWORD not in response.text
    assert "Traceback" not in response.text


def test_only_the_part_that_failed_is_named(pg_url: str, tmp_path: Path) -> None:
    redis_down = f"redis://127.0.0.1:{refused_port()}/0"
    with client_for(tmp_path, database_url=pg_url, redis_url=redis_down) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    details = response.json()["error"]["details"]
    assert [detail["field"] for detail in details] == ["redis"]


def test_a_store_and_a_redis_that_hang_answer_503_within_the_timeout(
    tmp_path: Path, silent_port: int
) -> None:
    store = f"postgresql+psycopg://orch:{PASSWORD}@127.0.0.1:{silent_port}/orch"
    redis_hangs = f"redis://127.0.0.1:{silent_port}/0"
    with client_for(tmp_path, database_url=store, redis_url=redis_hangs) as client:
        started = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    # Both checks at once, each cut at its timeout: one after the other would take at least
    # twice the timeout (a loaded machine adds more than a second to the one answer).
    assert elapsed < 2 * READY_TIMEOUT_SECONDS
    details = {detail["field"]: detail["message"] for detail in response.json()["error"]["details"]}
    assert set(details) == {"store", "redis"}
    assert "did not answer within" in details["store"]
