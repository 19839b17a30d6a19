"""Engines and transactions: the one place that knows how to talk to Postgres or SQLite."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, InvalidatePoolError
from sqlalchemy.pool import ConnectionPoolEntry

from orchestrator.errors import ConstraintViolation
from orchestrator.settings import SettingsError

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "PING_BYPASS_SECONDS",
    "Database",
    "cause_line",
    "make_engine",
    "wake_after_commit",
]

log = logging.getLogger(__name__)


def cause_line(exc: BaseException) -> str:
    """`Type: the driver's own message` in one line, no SQL text or parameters: how a log line
    names a store that is away (during an outage every worker writes many; a traceback each
    says nothing more)."""
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {cause[0] if cause else ''}"


#: A pooled connection given back less than this long ago is not pinged again on checkout (as
#: HikariCP's `aliveBypassWindowMs`, 500 ms by default): a worker's back-to-back transactions
#: save a round trip each, and a connection that sat idle longer is always pinged.
PING_BYPASS_SECONDS = 0.5
#: A database host that drops packets fails a connect in this many seconds, not never.
CONNECT_TIMEOUT_SECONDS = 10
#: A connection older than this is closed and replaced rather than used again (a server or a
#: proxy in between may drop long-lived connections).
RECYCLE_SECONDS = 1800
_CHECKED_IN_AT = "orch_checked_in_at"
_WAKE = "orch_wake_after_commit"


def wake_after_commit(conn: Connection, key: str) -> None:
    """Mark `key` (e.g. `task:ID`) to be announced once the unit of work on `conn` commits:
    a stream told before the commit would read nothing new and wait for its next poll."""
    conn.info.setdefault(_WAKE, set()).add(key)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Autocommit at the driver level: SQLAlchemy's "begin" event below decides how a
    # transaction starts, so a writer takes the lock up front instead of failing on upgrade.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
    conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 5, echo: bool = False
) -> Engine:
    """An engine for `url` with settings that suit a worker fleet (pre-ping, bounded pool)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            folder = Path(database).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SettingsError(
                    f"ORCH_HOME / ORCH_DATABASE_URL: cannot create {folder} for the SQLite "
                    f"store: {exc.strerror or exc}"
                ) from None
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    engine = create_engine(
        parsed,
        echo=echo,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=RECYCLE_SECONDS,
        pool_timeout=30,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
    )
    pre_ping(engine)
    return engine


def pre_ping(engine: Engine, bypass_seconds: float = PING_BYPASS_SECONDS) -> None:
    """Ping a pooled connection on checkout unless it was given back within `bypass_seconds`.

    SQLAlchemy's `pool_pre_ping`, with a bypass window: a dead connection (server restarted,
    idle connection dropped) is replaced before the transaction starts, as with the built-in
    setting; a failed ping that is a disconnect invalidates the whole pool, as it does there.
    """
    dialect = engine.dialect

    def on_checkin(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    def on_checkout(dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        given_back = record.info.get(_CHECKED_IN_AT)
        if given_back is None or time.monotonic() - given_back < bypass_seconds:
            return  # a new connection, or one that was in use a moment ago
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_conn, None):
                raise InvalidatePoolError(str(exc)) from exc
            raise

    event.listen(engine, "checkin", on_checkin)
    event.listen(engine, "checkout", on_checkout)


class Database:
    """Owns an engine; public store methods open one transaction each through `transaction()`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Told the keys a unit of work marked with `wake_after_commit`, after it committed
        #: (never for one that failed); must not raise. None: nobody listens.
        self.after_commit: Callable[[Collection[str]], None] | None = None
        self._disposed = False
        event.listen(engine, "checkin", self._close_once_disposed)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Database:
        return cls(make_engine(url, **kwargs))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self, *, readonly: bool = False) -> Iterator[Connection]:
        """One transaction; an integrity error becomes `ConstraintViolation` and writes nothing."""
        with self.engine.connect() as conn:
            if readonly and self.dialect == "sqlite":
                conn = conn.execution_options(sqlite_begin="DEFERRED")
            try:
                with conn.begin():
                    yield conn
            except IntegrityError as exc:
                raise ConstraintViolation(_integrity_message(exc)) from exc
            finally:
                marked = conn.info.pop(_WAKE, None)
        self._announce(marked)  # with the connection given back

    def _announce(self, marked: set[str] | None) -> None:
        if not marked or self.after_commit is None:
            return
        try:
            self.after_commit(marked)
        except Exception:  # the write committed: a lost wake-up only delays a stream's poll
            log.warning("wake-ups after a commit not sent", exc_info=True)

    def dispose(self) -> None:
        """Close the store's connections: those idle now, and each one in use now or taken
        later (a thread that outlived its process's close) when it is given back. Kept in a
        pool nobody disposes again, it stayed open until the garbage collector freed it."""
        self._disposed = True
        self.engine.dispose()

    def _close_once_disposed(self, _dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        if self._disposed:
            record.invalidate()


def _integrity_message(exc: IntegrityError) -> str:
    text = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return f"the store refused the write: {text}"
