"""Statements on Postgres sent straight to psycopg, past SQLAlchemy's execution layer.

A round sends about two dozen small statements (the claim, the transcript's entries, an
evidence record, the fence checks, the plan, the report, the end of the generation). Through
SQLAlchemy each one builds an execution context, processes its parameters and wraps its result,
and a statement sent alone also checks a connection out of the pool: for statements this small
that is about as much Python as the driver's own. Here they go to a binary raw cursor with
native `$n` placeholders (the SQL is compiled once per statement, the same text SQLAlchemy
would send) whose adapters are kept from one statement to the next:

- `rows(engine, ...)`: a statement that is its own transaction, sent in autocommit on plain
  psycopg connections kept in a small LIFO cache beside the store's pool (shared with the
  receipt claim, `store.fastclaim`, and the generation's claim,
  `generation_claims.claim_generation_alone`);
- `fetch(conn, ...)`: a statement inside the caller's SQLAlchemy transaction, on that pooled
  connection's own driver connection (SQLAlchemy itself sends it on SQLite).

Only the path to the server is shorter: the SQL, the locks and the transactions are the same.
Its parameters go to the driver as they are (no SQLAlchemy bind processing: JSON is passed as
text by the caller), and its rows come back as tuples (`records.driver_row` names them, with
timestamps in UTC).

As the store's pool does, a cached connection connects within `CONNECT_TIMEOUT_SECONDS`, and one
idle past the ping bypass window is pinged before use (a restarted server does not fail the
next write). The cache is emptied when the store's engine is disposed, and when it is garbage
collected.

Errors read as they would through SQLAlchemy: a refused write is `ConstraintViolation`, any
other driver error (a connect that failed included) the `sqlalchemy.exc.DBAPIError` subclass
SQLAlchemy would have raised (the rounds tell infrastructure failures by it), and a connection
that failed is closed, not kept.

The psycopg side (the cache, the compiled statements, the raw cursors) is `driver_psycopg`,
imported at the first statement sent to Postgres: a process on SQLite never imports psycopg.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.sql import ClauseElement, Executable

from orchestrator.store.db import PING_BYPASS_SECONDS as _POOL_PING_BYPASS_SECONDS

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.exc import StatementError

    from orchestrator.store.driver_psycopg import _Connections

__all__ = [
    "PING_BYPASS_SECONDS",
    "SLOT_TIMEOUT_SECONDS",
    "connections_for",
    "fetch",
    "observers",
    "rows",
    "store_error",
]

#: Told `(sql, autocommit)` of every statement sent here, before it is sent: SQLAlchemy's
#: `before_cursor_execute` does not see these, and what counts statements (the benchmarks, a
#: test that a write costs no extra round trip) must. Empty unless something counts.
observers: list[Callable[[str, bool], None]] = []

#: How long a statement waits for one of the cache's connections before it fails like a lost one.
SLOT_TIMEOUT_SECONDS = 30.0
#: A kept connection idle longer than this is pinged before it is used, as the store's pool
#: pings one on checkout (`store.db.pre_ping`).
PING_BYPASS_SECONDS = _POOL_PING_BYPASS_SECONDS


def connections_for(store: Engine) -> _Connections:
    """The cache of kept autocommit connections to `store` (a Postgres engine)."""
    from orchestrator.store import driver_psycopg

    return driver_psycopg.connections_for(store)


def rows(
    store: Engine, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Send `statement` (a `text()` clause with `:name` parameters, or a Core statement
    whose columns need no result processing) with `params` in autocommit on one of the
    cache's connections; the rows it returns. Never retried: a lost answer to a write may
    still have committed it."""
    from orchestrator.store import driver_psycopg

    return driver_psycopg.rows(store, statement, params)


def store_error(
    exc: psycopg.Error, sql: str | None = None, *, invalidated: bool = False
) -> StatementError:
    """`exc` as the `sqlalchemy.exc.DBAPIError` subclass SQLAlchemy raises for it (the rounds
    tell infrastructure failures by it), its parameters hidden."""
    from orchestrator.store import driver_psycopg

    return driver_psycopg.store_error(exc, sql, invalidated=invalidated)


def fetch(
    conn: Connection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """The rows of `statement` run in `conn`'s transaction. On Postgres a raw binary cursor
    kept with the driver connection sends it (`rows` above says why); elsewhere SQLAlchemy does.
    Only for statements whose columns need no result processing of SQLAlchemy's (plain
    strings, numbers, booleans: a timestamp comes back in the session's zone, JSON as psycopg
    parses it). A connection the error broke is invalidated as SQLAlchemy would."""
    if conn.dialect.name != "postgresql":
        result = conn.execute(cast(Executable, statement), dict(params))
        return [tuple(row) for row in result] if result.returns_rows else []
    from orchestrator.store import driver_psycopg

    return driver_psycopg.fetch(conn, statement, params)
