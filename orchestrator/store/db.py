"""Engines and transactions: the one place that knows how to talk to Postgres or SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from orchestrator.errors import ConstraintViolation
from orchestrator.settings import SettingsError

__all__ = ["Database", "make_engine"]


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
    return create_engine(
        parsed,
        echo=echo,
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=1800,
        pool_timeout=30,
        # A database host that drops packets fails a connect in bounded time, not never.
        connect_args={"connect_timeout": 10},
    )


class Database:
    """Owns an engine; public store methods open one transaction each through `transaction()`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        """A unit of work that is one statement on Postgres: sent in autocommit, no BEGIN or
        COMMIT round trip (the statement is its own transaction). Elsewhere a transaction."""
        if self.dialect != "postgresql":
            with self.transaction() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            try:
                yield conn
            except IntegrityError as exc:
                raise ConstraintViolation(_integrity_message(exc)) from exc

    def dispose(self) -> None:
        self.engine.dispose()


def _integrity_message(exc: IntegrityError) -> str:
    text = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return f"the store refused the write: {text}"
