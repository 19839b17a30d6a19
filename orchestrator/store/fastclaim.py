"""The unfenced receipt claim on Postgres as one autocommit statement on a driver connection.

Why a separate path: a claim sits in front of every write tool, and contending claimers of one
identity wait on the winner's insert. As one statement (insert, or read the existing row when
the insert conflicted) that commits at once, the winner's row is visible as soon as its single
round trip ends. The connections come from a small pool beside the store's own, without the
pre-ping round trip; it is disposed together with the store's engine.

A lost answer is retried once with the very same row values: the claim is idempotent for them
(the read back finds our own invocation id and grants), so a retry can never grant twice.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, event

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
_VALUES = ", ".join(f"%({name})s" for name in COLUMNS)

# A row committed by a concurrent claimer after this statement's snapshot is not visible to its
# own read: then the statement returns nothing and the plain read below finds it.
_CLAIM = (
    f"WITH inserted AS (INSERT INTO invocation_receipts ({_LISTED}) VALUES ({_VALUES}) "
    f"ON CONFLICT (owner, identity_key) DO NOTHING RETURNING {_LISTED}) "
    f"SELECT {_LISTED} FROM inserted UNION ALL "
    f"SELECT {_LISTED} FROM invocation_receipts "
    "WHERE owner = %(owner)s AND identity_key = %(identity_key)s "
    "AND NOT EXISTS (SELECT 1 FROM inserted)"
)
_READ = (
    f"SELECT {_LISTED} FROM invocation_receipts "
    "WHERE owner = %(owner)s AND identity_key = %(identity_key)s"
)

_engines: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _engine_for(store: Engine) -> Engine:
    with _lock:
        fast = _engines.get(store)
        if fast is None:
            pool = store.pool
            size = pool.size() if hasattr(pool, "size") else 5
            overflow = int(getattr(pool, "_max_overflow", 5))
            fast = create_engine(
                store.url,
                isolation_level="AUTOCOMMIT",
                pool_size=max(1, size),
                max_overflow=max(0, overflow),
                pool_recycle=1800,
                pool_timeout=30,
            )
            _engines[store] = fast
            event.listen(store, "engine_disposed", _dispose_with(fast))
        return fast


def _dispose_with(fast: Engine) -> Any:
    def dispose(_engine: Engine) -> None:
        fast.dispose()

    return dispose


def claim_row(store: Engine, values: Mapping[str, Any]) -> dict[str, Any]:
    """Insert `values` unless `(owner, identity_key)` exists; return the row that stands."""
    fast = _engine_for(store)
    params = dict(values)
    for attempt in (1, 2):
        connection = fast.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                cursor.execute(_CLAIM, params)
                row = cursor.fetchone()
                if row is None:
                    cursor.execute(_READ, params)
                    row = cursor.fetchone()
            finally:
                cursor.close()
        except psycopg.OperationalError:
            # Broken or stale connection: drop it and try once more with the same values.
            connection.invalidate()
            if attempt == 2:
                raise
            continue
        except psycopg.IntegrityError as exc:
            connection.close()
            raise ConstraintViolation(f"the store refused the claim: {exc}") from exc
        except BaseException:
            connection.close()
            raise
        connection.close()
        if row is None:  # cannot happen: a claimed row is only deleted once finished
            raise RuntimeError("the claimed identity was not found on read back")
        return _as_dict(row)
    raise AssertionError("unreachable")


def _as_dict(row: Any) -> dict[str, Any]:
    result = dict(zip(COLUMNS, row, strict=True))
    for name in ("created_at", "updated_at"):
        value = result[name]
        if isinstance(value, datetime):
            result[name] = value.astimezone(UTC)
    return result
