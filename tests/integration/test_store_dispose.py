"""A disposed store closes every connection it gave out, also one given back afterwards.

`Database.dispose` (`Runtime.close`, the API's shutdown, a command's end) closed the connections
idle then. One in use at that moment (a hand-back retry, a readiness probe or a lease renewal
on a thread that outlived the close) went back into the disposed pool, and one taken afterwards
into a new pool: both stayed open in pools nobody closed again, until the garbage collector freed
them with psycopg's ResourceWarning, in whichever test ran then (`filterwarnings = error`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from orchestrator.store import Database
from orchestrator.store import driver as driver_module

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url)
    yield database
    database.dispose()


def test_a_connection_in_use_when_the_store_is_disposed_is_closed_when_given_back(
    pg_db: Database,
) -> None:
    with pg_db.transaction() as conn:
        raw = conn.connection.driver_connection
        pg_db.dispose()
        assert conn.execute(text("SELECT 1")).scalar() == 1  # the transaction goes on
        assert not raw.closed
    assert raw.closed


def test_a_transaction_after_the_dispose_works_and_closes_its_connection(
    pg_db: Database,
) -> None:
    pg_db.dispose()
    with pg_db.transaction() as conn:
        raw = conn.connection.driver_connection
        assert conn.execute(text("SELECT 1")).scalar() == 1
    assert raw.closed


def test_a_thread_that_outlives_the_dispose_leaves_no_connection_open(pg_db: Database) -> None:
    inside, disposed = threading.Event(), threading.Event()
    opened: list[object] = []

    def straggler() -> None:
        with pg_db.transaction() as conn:
            opened.append(conn.connection.driver_connection)
            inside.set()
            disposed.wait(10)
        with pg_db.transaction() as conn:  # one more round, after the close
            opened.append(conn.connection.driver_connection)

    thread = threading.Thread(target=straggler)
    thread.start()
    assert inside.wait(10)
    pg_db.dispose()
    disposed.set()
    thread.join(10)
    assert len(opened) == 2
    assert all(raw.closed for raw in opened)  # type: ignore[attr-defined]


def test_a_claim_connection_taken_after_the_dispose_is_closed_when_given_back(
    pg_db: Database,
) -> None:
    cache = driver_module.connections_for(pg_db.engine)
    pg_db.dispose()
    cursor, epoch = cache.take()
    cache.give(cursor, epoch)
    assert cursor.connection.closed
    assert not cache.idle
