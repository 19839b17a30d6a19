"""The psycopg side of `store.driver`: the kept connections, the statements compiled for a raw
cursor, and the errors as SQLAlchemy's. `store.driver` says why and how; this module is imported
at the first statement a process sends to Postgres, so that a process on the embedded store
(SQLite) never imports psycopg (0.1 s of CPU at every start of an operator's command).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, Engine, event
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import ClauseElement

from orchestrator.errors import ConstraintViolation
from orchestrator.store import driver
from orchestrator.store.db import CONNECT_TIMEOUT_SECONDS, RECYCLE_SECONDS

__all__ = ["connections_for", "fetch", "rows", "store_error"]

_Cursor = psycopg.RawCursor[tuple[Any, ...]]


class _Connections:
    """Idle autocommit connections, most recently used first, each with its kept cursor;
    about `size` kept idle.

    A deque's append and pop are atomic, so taking and giving back take no lock of their own:
    with many claimer threads a lock here turns into a convoy behind the interpreter lock. The
    one semaphore bounds the connections open at once (uncontended, it costs no wait).
    """

    def __init__(self, conninfo: str, size: int) -> None:
        self.conninfo = conninfo
        self.size = size
        self.idle: deque[_Cursor] = deque()
        self.epoch = 0
        self.disposed = False
        # At most `size` connections open at once, like the store's pool: a threads-pool worker
        # with hundreds of executions must not open a connection per claiming thread.
        self.slots = threading.BoundedSemaphore(size)
        self.pid = os.getpid()
        weakref.finalize(self, _close_all, self.idle, self.pid)

    def take(self) -> tuple[_Cursor, int]:
        """A connection's cursor and the cache's epoch; a driver error as SQLAlchemy's class,
        as the pool's own connect failure would be (the rounds tell infrastructure by it)."""
        try:
            return self._take()
        except psycopg.Error as exc:
            raise store_error(exc) from exc

    def _take(self) -> tuple[_Cursor, int]:
        if not self.slots.acquire(timeout=driver.SLOT_TIMEOUT_SECONDS):
            raise psycopg.OperationalError("no claim connection became free in time")
        epoch = self.epoch
        try:
            while True:
                try:
                    cursor = self.idle.pop()
                except IndexError:
                    break
                if _fresh(cursor) and _alive(cursor):
                    return cursor, epoch
                # Too old (as the pool recycles), or dropped while idle: the next, or a new one.
                cursor.connection.close()
            connection = psycopg.connect(
                self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
            )
        except BaseException:
            self.slots.release()
            raise
        cursor = _Kept(connection)
        cursor.opened_at = time.monotonic()
        cursor.format = psycopg.pq.Format.BINARY
        return cursor, epoch

    def give(self, cursor: _Cursor, epoch: int) -> None:
        # The size check may race and keep one or two more: harmless, still bounded.
        if (
            epoch == self.epoch
            and not self.disposed
            and len(self.idle) < self.size
            and not cursor.connection.closed
        ):
            if isinstance(cursor, _Kept):
                cursor.given_at = time.monotonic()
            self.idle.append(cursor)
        else:
            cursor.connection.close()
        self.slots.release()

    def drop(self, cursor: _Cursor) -> None:
        """Close a connection that failed, and free its slot."""
        cursor.connection.close()
        self.slots.release()

    def dispose(self) -> None:
        """Close the idle connections; one given back later is closed then (as the store's)."""
        self.disposed = True
        self.epoch += 1
        _close_all(self.idle, self.pid)


class _Kept(psycopg.RawCursor[tuple[Any, ...]]):
    """A kept cursor, with when its connection opened and when it was last given back."""

    opened_at = 0.0
    given_at = 0.0


def _fresh(cursor: _Cursor) -> bool:
    """False for a connection opened more than `RECYCLE_SECONDS` ago (the pool's rule)."""
    return time.monotonic() - getattr(cursor, "opened_at", 0.0) < RECYCLE_SECONDS


def _alive(cursor: _Cursor) -> bool:
    """True unless a cursor idle past `driver.PING_BYPASS_SECONDS` fails a ping (as the pool)."""
    if time.monotonic() - getattr(cursor, "given_at", 0.0) < driver.PING_BYPASS_SECONDS:
        return True
    try:
        cursor.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _close_all(cursors: deque[_Cursor], pid: int) -> None:
    """Close the connections of `cursors`, opened by process `pid`. In a forked child they are
    only forgotten: closing one there would end the parent's session on the server."""
    mine = os.getpid() == pid
    while True:
        try:
            cursor = cursors.pop()
        except IndexError:
            return
        if mine:
            cursor.connection.close()


_caches: weakref.WeakKeyDictionary[Engine, _Connections] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def connections_for(store: Engine) -> _Connections:
    cache = _caches.get(store)
    if cache is not None:
        return cache
    with _caches_lock:
        cache = _caches.get(store)
        if cache is None:
            url = store.url.set(drivername="postgresql")
            pool = store.pool
            size = pool.size() if hasattr(pool, "size") else 5
            overflow = int(getattr(pool, "_max_overflow", 5))
            cache = _Connections(url.render_as_string(hide_password=False), size + overflow)
            _caches[store] = cache
            event.listen(store, "engine_disposed", _disposer(cache))
        return cache


def _disposer(cache: _Connections) -> Any:
    reference = weakref.ref(cache)

    def dispose(_engine: Engine) -> None:
        live = reference()
        if live is not None:
            live.dispose()

    return dispose


_DIALECT = PGDialect_psycopg(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the parameters in `$n` order (a name used twice is sent once)
    given: dict[str, Any]  # the values the statement carries itself (`.values(status="x")`)

    def values(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        given = self.given
        values = tuple([params[n] if n in params else given[n] for n in self.names])
        # As `types.UTCDateTime` refuses one through SQLAlchemy: the server would read a naive
        # timestamp in the session's time zone.
        for value in values:
            if isinstance(value, datetime) and value.tzinfo is None:
                raise ValueError("naive datetime given to the store: timestamps must be aware")
        return values


@lru_cache(maxsize=256)
def _compiled(statement: ClauseElement) -> _Compiled:
    """`statement` as psycopg's raw cursor takes it. Its parameters go to the driver as they
    are: SQLAlchemy's bind processing (a JSON column's serialiser, a type decorator) is not
    applied, so only plain values belong in them. An `IN` list is refused (it is expanded per
    call): use `= ANY(:array)` instead."""
    compiled = statement.compile(dialect=_DIALECT)
    if getattr(compiled, "post_compile_params", None):
        raise ValueError(f"an expanding IN list cannot go straight to the driver: {compiled}")
    given = {
        name: bind.value
        for bind, name in getattr(compiled, "bind_names", {}).items()
        if not bind.required
    }
    return _Compiled(str(compiled), tuple(getattr(compiled, "positiontup", None) or ()), given)


def rows(
    store: Engine, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """`driver.rows`: `statement` sent in autocommit on one of the cache's connections."""
    compiled = _compiled(statement)
    sql, values = compiled.sql, compiled.values(params)
    for observe in driver.observers:
        observe(sql, True)
    cache = connections_for(store)
    cursor, epoch = cache.take()
    try:
        cursor.execute(sql, values)
        returned = _returned(cursor)
    except psycopg.IntegrityError as exc:
        cache.give(cursor, epoch)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConstraintViolation(f"the store refused the write: {text}") from exc
    except psycopg.Error as exc:
        if cursor.connection.closed or cursor.connection.broken or not _idle(cursor):
            cache.drop(cursor)
        else:
            cache.give(cursor, epoch)
        raise store_error(exc, sql) from exc
    except BaseException:
        cache.drop(cursor)
        raise
    cache.give(cursor, epoch)
    return returned


def _returned(cursor: _Cursor) -> list[tuple[Any, ...]]:
    """The rows of the statement just run; none for a statement that returns none. Read from
    the result's status: `cursor.description` builds a column object per column each time."""
    result = cursor.pgresult
    if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:
        return []
    return cursor.fetchall()


def _idle(cursor: _Cursor) -> bool:
    status = cursor.connection.info.transaction_status
    return bool(status == psycopg.pq.TransactionStatus.IDLE)


def store_error(
    exc: psycopg.Error, sql: str | None = None, *, invalidated: bool = False
) -> StatementError:
    """`driver.store_error`."""
    return DBAPIError.instance(
        sql,
        None,
        exc,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=invalidated,
        dialect=_DIALECT,
    )


_KEPT_CURSOR = "orch_raw_cursor"


def fetch(
    conn: Connection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """`driver.fetch` on Postgres: a raw binary cursor kept with the driver connection."""
    compiled = _compiled(statement)
    sql, values = compiled.sql, compiled.values(params)
    pooled = conn.connection
    driver_connection = cast(psycopg.Connection[Any], pooled.driver_connection)
    cursor: _Cursor | None = pooled.info.get(_KEPT_CURSOR)
    if cursor is None or cursor.closed or cursor.connection is not driver_connection:
        cursor = psycopg.RawCursor(driver_connection)
        cursor.format = psycopg.pq.Format.BINARY
        pooled.info[_KEPT_CURSOR] = cursor
    for observe in driver.observers:
        observe(sql, driver_connection.autocommit)
    try:
        cursor.execute(sql, values)
        return _returned(cursor)
    except psycopg.Error as exc:
        gone = conn.dialect.is_disconnect(exc, driver_connection, cursor)  # type: ignore[arg-type]
        if gone:
            conn.invalidate(exc)
        raise store_error(exc, sql, invalidated=gone) from exc
