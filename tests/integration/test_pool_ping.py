"""The Postgres pool pings a connection before use unless it was given back a moment ago."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from orchestrator.store.db import PING_BYPASS_SECONDS, Database


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url, pool_size=2, max_overflow=0)
    yield database
    database.dispose()


def backend_pid(db: Database) -> int:
    with db.transaction() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(pg_url: str, pid: int) -> None:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def count_pings(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    original = db.engine.dialect.do_ping

    def counting(dbapi_conn: Any) -> bool:
        pings.append(1)
        return bool(original(dbapi_conn))

    monkeypatch.setattr(db.engine.dialect, "do_ping", counting)
    return pings


def test_a_connection_that_died_while_idle_is_replaced_before_the_transaction(
    pg_db: Database, pg_url: str
) -> None:
    first = backend_pid(pg_db)
    terminate(pg_url, first)
    time.sleep(PING_BYPASS_SECONDS + 0.1)
    second = backend_pid(pg_db)  # no error: the ping found the dead connection first
    assert second != first


def test_back_to_back_transactions_are_not_pinged_and_idle_ones_are(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend_pid(pg_db)
    pings = count_pings(pg_db, monkeypatch)
    for _ in range(5):
        backend_pid(pg_db)
    assert pings == []
    time.sleep(PING_BYPASS_SECONDS + 0.1)
    backend_pid(pg_db)
    assert len(pings) == 1


def test_a_connection_killed_inside_the_window_fails_once_and_is_then_replaced(
    pg_db: Database, pg_url: str
) -> None:
    # The price of the window: the first use finds the dead connection; the pool drops it, so
    # the next transaction gets a new one (a worker's round is left to recovery meanwhile).
    first = backend_pid(pg_db)
    terminate(pg_url, first)
    with pytest.raises(OperationalError):
        backend_pid(pg_db)
    assert backend_pid(pg_db) != first
