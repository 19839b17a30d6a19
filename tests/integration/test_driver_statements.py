"""`store.driver`: fenced single statements sent straight to psycopg read back and fail as they
would through SQLAlchemy (the rounds tell infrastructure failures by SQLAlchemy's classes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError, OperationalError

from orchestrator.errors import ConstraintViolation
from orchestrator.store import Database, driver


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url)
    yield database
    database.dispose()


_ECHO = text("SELECT CAST(:a AS integer) + CAST(:b AS integer), CAST(:a AS integer), :c")


def _backend_pid(pg_db: Database) -> int:
    (pid,) = driver.rows(pg_db.engine, text("SELECT pg_backend_pid()"), {})[0]
    return int(pid)


def test_named_parameters_reach_the_server_in_order_and_a_name_used_twice_once(
    pg_db: Database,
) -> None:
    assert driver.rows(pg_db.engine, _ECHO, {"a": 2, "b": 40, "c": "x"}) == [(42, 2, "x")]
    assert driver.rows(pg_db.engine, _ECHO, {"c": None, "b": 1, "a": 1}) == [(2, 1, None)]


def test_a_statement_that_returns_nothing_gives_no_rows(pg_db: Database) -> None:
    assert driver.rows(pg_db.engine, text("SELECT 1 WHERE false"), {}) == []
    assert driver.rows(pg_db.engine, text("SET LOCAL work_mem = '4MB'"), {}) == []


def test_a_refused_write_is_a_constraint_violation_and_the_connection_is_kept(
    pg_db: Database,
) -> None:
    with pg_db.transaction() as conn:
        conn.execute(text("CREATE TABLE driver_unique (k integer PRIMARY KEY)"))
    insert = text("INSERT INTO driver_unique (k) VALUES (:k) RETURNING k")
    assert driver.rows(pg_db.engine, insert, {"k": 1}) == [(1,)]
    pid = _backend_pid(pg_db)
    with pytest.raises(ConstraintViolation, match="the store refused the write"):
        driver.rows(pg_db.engine, insert, {"k": 1})
    assert _backend_pid(pg_db) == pid  # the same connection, still usable
    with pg_db.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM driver_unique")).scalar_one() == 1


def test_a_server_error_is_sqlalchemys_class_and_hides_the_parameters(pg_db: Database) -> None:
    divide = text("SELECT CAST(:n AS integer) / 0, :secret")
    with pytest.raises(DataError) as raised:
        driver.rows(pg_db.engine, divide, {"n": 1, "secret": "sk-do-not-log"})
    assert "division by zero" in str(raised.value)
    assert "sk-do-not-log" not in str(raised.value)
    assert driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 1, "c": "ok"}) == [(2, 1, "ok")]


def test_a_connection_the_server_dropped_is_an_operational_error_then_replaced(
    pg_db: Database,
) -> None:
    pid = _backend_pid(pg_db)
    cache = driver.connections_for(pg_db.engine)
    with pg_db.transaction() as conn:
        # Every kept connection of the cache is this one (the calls above ran one at a time).
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with pytest.raises(OperationalError):
        driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 1, "c": "x"})
    assert all(not cursor.connection.closed for cursor in cache.idle)  # the dead one dropped
    assert driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 2, "c": "y"}) == [(3, 1, "y")]
    assert _backend_pid(pg_db) != pid
