"""`store.driver`: fenced single statements sent straight to psycopg read back and fail as they
would through SQLAlchemy (the rounds tell infrastructure failures by SQLAlchemy's classes)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Integer, make_url, text
from sqlalchemy.exc import DataError, OperationalError

from orchestrator.errors import ConstraintViolation
from orchestrator.store import Database, driver, driver_psycopg
from orchestrator.store.db import CONNECT_TIMEOUT_SECONDS
from tests.services import refused_port


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
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Used a moment ago (within the ping bypass window, as the pool's): not checked first.
    monkeypatch.setattr(driver, "PING_BYPASS_SECONDS", 60.0)
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


def test_fetch_runs_in_the_callers_transaction(db: Database) -> None:
    # `db` is each store back end: Postgres through the kept raw cursor, SQLite through
    # SQLAlchemy; both give plain tuples.
    with db.transaction() as conn:
        conn.execute(text("CREATE TABLE driver_fetch (k integer PRIMARY KEY, v varchar(8))"))
    count = text("SELECT count(*), max(v) FROM driver_fetch WHERE k > :floor")
    with pytest.raises(RuntimeError), db.transaction() as conn:
        conn.execute(text("INSERT INTO driver_fetch (k, v) VALUES (1, 'a')"))
        assert driver.fetch(conn, count, {"floor": 0}) == [(1, "a")]  # its own write
        raise RuntimeError("roll it back")
    with db.transaction() as conn:
        assert driver.fetch(conn, count, {"floor": 0}) == [(0, None)]
        assert driver.fetch(conn, text("SELECT 1 WHERE 1 = 0"), {}) == []


def test_fetch_on_a_connection_the_server_dropped_invalidates_it(
    pg_db: Database, pg_url: str
) -> None:
    with pg_db.transaction() as conn:
        pid = driver.fetch(conn, text("SELECT pg_backend_pid()"), {})[0][0]
    conninfo = make_url(pg_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(conninfo, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(OperationalError) as raised, pg_db.transaction() as conn:
        driver.fetch(conn, _ECHO, {"a": 1, "b": 1, "c": "x"})
    assert raised.value.connection_invalidated
    with pg_db.transaction() as conn:  # the pool replaced it
        assert driver.fetch(conn, _ECHO, {"a": 1, "b": 1, "c": "x"}) == [(2, 1, "x")]
        assert driver.fetch(conn, text("SELECT pg_backend_pid()"), {})[0][0] != pid


def test_values_a_statement_carries_itself_are_sent_and_an_in_list_is_refused(
    pg_db: Database,
) -> None:
    from sqlalchemy import bindparam, column, literal, select

    carried = select(literal("fixed"), bindparam("given", type_=Integer()))
    assert driver.rows(pg_db.engine, carried, {"given": 7}) == [("fixed", 7)]
    listed = select(literal(1)).where(column("x").in_(["a", "b"]))
    with pytest.raises(ValueError, match="IN list"):
        driver.rows(pg_db.engine, listed, {})


def test_observers_are_told_every_statement_and_whether_it_commits_alone(
    pg_db: Database,
) -> None:
    told: list[tuple[str, bool]] = []

    def observe(sql: str, autocommit: bool) -> None:
        told.append((sql.split()[0], autocommit))

    driver.observers.append(observe)
    try:
        driver.rows(pg_db.engine, text("SELECT 1"), {})
        with pg_db.transaction() as conn:
            driver.fetch(conn, text("SELECT 2"), {})
        driver.rows(pg_db.engine, text("VALUES (3)"), {})
    finally:
        driver.observers.remove(observe)
    assert told == [("SELECT", True), ("SELECT", False), ("VALUES", True)]


def test_a_store_that_cannot_be_reached_is_sqlalchemys_operational_error(pg_url: str) -> None:
    # The rounds stop on an infrastructure error (`DBAPIError`) and let recovery requeue the
    # generation: a raw psycopg error would fail the task as an agent error instead.
    url = make_url(pg_url).set(host="127.0.0.1", port=refused_port(), password="pw-do-not-log")
    database = Database.from_url(url.render_as_string(hide_password=False))
    try:
        with pytest.raises(OperationalError) as raised:
            driver.rows(database.engine, _ECHO, {"a": 1, "b": 1, "c": "x"})
        assert "pw-do-not-log" not in str(raised.value)
        assert not driver.connections_for(database.engine).idle
    finally:
        database.dispose()


def test_no_free_connection_in_time_is_sqlalchemys_operational_error(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "SLOT_TIMEOUT_SECONDS", 0.05)
    cache = driver.connections_for(pg_db.engine)
    held = [cache.take() for _ in range(cache.size)]
    try:
        with pytest.raises(OperationalError, match="became free in time"):
            driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 1, "c": "x"})
    finally:
        for cursor, epoch in held:
            cache.give(cursor, epoch)
    assert driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 1, "c": "x"}) == [(2, 1, "x")]


def test_kept_connections_connect_in_bounded_time_as_the_pool_does(pg_db: Database) -> None:
    driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 1, "c": "x"})
    (cursor,) = driver.connections_for(pg_db.engine).idle
    parameters = cursor.connection.info.get_parameters()
    assert parameters.get("connect_timeout") == str(CONNECT_TIMEOUT_SECONDS)


def test_a_kept_connection_the_server_dropped_while_idle_is_replaced_before_the_statement(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the pool's pre-ping: a connection idle past the bypass window is checked first, so a
    # restarted server or a dropped idle connection does not fail the next write.
    monkeypatch.setattr(driver, "PING_BYPASS_SECONDS", 0.0)
    pid = _backend_pid(pg_db)
    with pg_db.transaction() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    assert driver.rows(pg_db.engine, _ECHO, {"a": 1, "b": 2, "c": "y"}) == [(3, 1, "y")]
    assert _backend_pid(pg_db) != pid


def test_a_forked_child_never_closes_the_parents_kept_connections(pg_db: Database) -> None:
    # A prefork worker's child rebuilds its runtime; the parent's cache it inherited may be
    # disposed or collected there. Closing a connection sends the server a terminate on the
    # socket both processes share: the parent's connection would be gone.
    import os

    pid = _backend_pid(pg_db)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        try:
            driver.connections_for(pg_db.engine).dispose()
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0
    assert _backend_pid(pg_db) == pid  # the same connection, still open on the server


def test_fetch_of_a_statement_that_returns_no_rows_gives_none_on_every_store(
    db: Database,
) -> None:
    with db.transaction() as conn:
        conn.execute(text("CREATE TABLE driver_none (k integer)"))
        assert driver.fetch(conn, text("INSERT INTO driver_none (k) VALUES (:k)"), {"k": 1}) == []
        assert driver.fetch(conn, text("SELECT k FROM driver_none"), {}) == [(1,)]


def test_a_kept_connection_older_than_the_recycle_age_is_replaced(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = _backend_pid(pg_db)
    assert _backend_pid(pg_db) == pid  # kept while young
    monkeypatch.setattr(driver_psycopg, "RECYCLE_SECONDS", 0.0)
    assert _backend_pid(pg_db) != pid  # as the pool's pool_recycle: a new connection


def test_a_naive_timestamp_is_refused_as_sqlalchemy_refuses_it(pg_db: Database) -> None:
    from datetime import UTC, datetime

    stamp = text("SELECT CAST(:at AS timestamptz)")
    with pytest.raises(ValueError, match="naive datetime"):
        driver.rows(pg_db.engine, stamp, {"at": datetime(2026, 1, 1, 12)})
    with pytest.raises(ValueError, match="naive datetime"), pg_db.transaction() as conn:
        driver.fetch(conn, stamp, {"at": datetime(2026, 1, 1, 12)})
    aware = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert driver.rows(pg_db.engine, stamp, {"at": aware})[0][0] == aware


def test_a_trigger_is_one_autocommit_statement_on_the_drivers_kept_connections(
    pg_db: Database,
) -> None:
    """The trigger is on the business backend's trigger -> agent start path: its one statement
    goes to the driver (as the worker's claim does), not through a pooled connection switched
    to autocommit and back; a second trigger with the same id inserts nothing."""
    from sqlalchemy import event

    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import TaskService, Trigger

    told: list[tuple[str, bool]] = []
    checkouts: list[object] = []

    def observe(sql: str, autocommit: bool) -> None:
        told.append((sql.split()[0], autocommit))

    def checked_out(*_: object) -> None:
        checkouts.append(_)

    service = TaskService(pg_db, RecordingDispatcher())
    service.trigger(Trigger(task_type="t", title="warm", trigger_id="warm"))  # pool filled
    driver.observers.append(observe)
    event.listen(pg_db.engine, "checkout", checked_out)
    try:
        sent = Trigger(task_type="t", title="once", context={"zone": 4}, trigger_id="driver:1")
        first = service.trigger(sent)
        assert (told, checkouts) == ([("WITH", True)], [])
        again = service.trigger(sent)
    finally:
        event.remove(pg_db.engine, "checkout", checked_out)
        driver.observers.remove(observe)
    assert (first.created, again.created) == (True, False)
    assert again.task.task_id == first.task.task_id
    stored = service.get(first.task.task_id)
    assert (stored.context, stored.status, stored.generation) == ({"zone": 4}, "queued", 1)
