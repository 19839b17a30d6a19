"""The unfenced receipt claim on Postgres: one autocommit statement on a driver connection.

Why a separate path: a claim sits in front of every write tool, and contending claimers of one
identity wait on the winner's insert. As one statement (insert, or read the existing row when
the insert conflicted) that commits at once, the winner's row is visible as soon as its single
round trip ends. The statement runs on plain psycopg connections kept in a small LIFO cache
beside the store's pool: no pre-ping round trip, no pool bookkeeping per claim. The cache is
emptied when the store's engine is disposed, and when it is garbage collected.

A lost answer is retried once with the very same row values: the claim is idempotent for them
(the read back finds our own invocation id and grants), so a retry can never grant twice.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from orchestrator.errors import ConstraintViolation

__all__ = ["COLUMNS", "claim_row"]

COLUMNS = (
    "invocation_id",
    "owner",
    "session_id",
    "tool_name",
    "identity_key",
    "args_digest",
    "claim_token",
    "status",
    "summary",
    "created_at",
    "updated_at",
)
_LISTED = ", ".join(COLUMNS)
_VALUES = ", ".join(["%s"] * len(COLUMNS))  # positional: cheaper to bind than named
_NULLS = ", ".join(["NULL"] * 8 + ["NULL::timestamptz"] * 2)

# The winner gets back only its id (it knows the rest); a loser gets the standing row. A row
# committed by a concurrent claimer after this statement's snapshot is not visible to its own
# read: then the statement returns nothing and the plain read below finds it.
_CLAIM = (
    f"WITH inserted AS (INSERT INTO invocation_receipts ({_LISTED}) VALUES ({_VALUES}) "
    "ON CONFLICT (owner, identity_key) DO NOTHING RETURNING invocation_id) "
    f"SELECT invocation_id, {_NULLS} FROM inserted UNION ALL "
    f"SELECT {_LISTED} FROM invocation_receipts "
    "WHERE owner = %s AND identity_key = %s AND NOT EXISTS (SELECT 1 FROM inserted)"
)
_READ = f"SELECT {_LISTED} FROM invocation_receipts WHERE owner = %s AND identity_key = %s"


class _Connections:
    """Idle autocommit connections, most recently used first; about `size` kept idle.

    A deque's append and pop are atomic, so taking and giving back take no lock: with many
    claimer threads a lock here turns into a convoy behind the interpreter lock.
    """

    def __init__(self, conninfo: str, size: int) -> None:
        self.conninfo = conninfo
        self.size = size
        self.idle: deque[psycopg.Connection[Any]] = deque()
        self.epoch = 0
        weakref.finalize(self, _close_all, self.idle)

    def take(self) -> tuple[psycopg.Connection[Any], int]:
        epoch = self.epoch
        try:
            return self.idle.pop(), epoch
        except IndexError:
            pass
        return psycopg.connect(self.conninfo, autocommit=True), epoch

    def give(self, connection: psycopg.Connection[Any], epoch: int) -> None:
        # The size check may race and keep one or two more: harmless, still bounded.
        if epoch == self.epoch and len(self.idle) < self.size and not connection.closed:
            self.idle.append(connection)
        else:
            connection.close()

    def dispose(self) -> None:
        self.epoch += 1
        _close_all(self.idle)


def _close_all(connections: deque[psycopg.Connection[Any]]) -> None:
    while True:
        try:
            connections.pop().close()
        except IndexError:
            return


_caches: weakref.WeakKeyDictionary[Engine, _Connections] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def _connections_for(store: Engine) -> _Connections:
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


def claim_row(store: Engine, values: Mapping[str, Any]) -> Mapping[str, Any]:
    """Insert `values` unless `(owner, identity_key)` exists; return the row that stands."""
    cache = _connections_for(store)
    key = (values["owner"], values["identity_key"])
    params = (*(values[name] for name in COLUMNS), *key)
    for attempt in (1, 2):
        connection, epoch = cache.take()
        try:
            row = connection.execute(_CLAIM, params).fetchone()
            if row is None:
                row = connection.execute(_READ, key).fetchone()
        except psycopg.OperationalError:
            # Broken or stale connection: drop it and try once more with the same values.
            connection.close()
            if attempt == 2:
                raise
            continue
        except psycopg.IntegrityError as exc:
            cache.give(connection, epoch)
            raise ConstraintViolation(f"the store refused the claim: {exc}") from exc
        except BaseException:
            connection.close()
            raise
        cache.give(connection, epoch)
        if row is None:  # cannot happen: a claimed row is only deleted once finished
            raise RuntimeError("the claimed identity was not found on read back")
        if row[0] == values["invocation_id"] and row[1] is None:
            return values  # ours: the statement returned only our id
        return _as_dict(row)
    raise AssertionError("unreachable")


def _as_dict(row: Any) -> dict[str, Any]:
    result = dict(zip(COLUMNS, row, strict=True))
    for name in ("created_at", "updated_at"):
        value = result[name]
        if isinstance(value, datetime):
            result[name] = value.astimezone(UTC)
    return result
