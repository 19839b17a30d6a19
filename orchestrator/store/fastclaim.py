"""The unfenced receipt claim on Postgres: one autocommit statement on a driver connection.

Why a separate path: a claim sits in front of every write tool, and contending claimers of one
identity wait on the winner's insert. As one statement (insert, or read the existing row when
the insert conflicted) that commits at once, the winner's row is visible as soon as its single
round trip ends. The statement runs on plain psycopg connections kept in a small LIFO cache
beside the store's pool: no pre-ping round trip, no pool bookkeeping per claim. The cache is
emptied when the store's engine is disposed, and when it is garbage collected.

Each cached connection keeps one binary raw cursor. Claimers share one interpreter, so the
client's Python per claim bounds their rate: a kept cursor keeps its adapters (a fresh one looks
up and builds a loader per column and a dumper per parameter every time), native `$n`
placeholders need no client-side rewriting of the query and send the key once, and binary
parameters and results skip formatting and parsing the timestamps as text.

A lost answer is retried once with the very same row values: the claim is idempotent for them
(the read back finds our own invocation id and grants), so a retry can never grant twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from sqlalchemy import Engine

from orchestrator.errors import ConstraintViolation
from orchestrator.store import driver

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
_VALUES = ", ".join(f"${number}" for number in range(1, len(COLUMNS) + 1))
_NULLS = ", ".join(["NULL"] * 8 + ["NULL::timestamptz"] * 2)
_OWNER, _IDENTITY = COLUMNS.index("owner"), COLUMNS.index("identity_key")
_ROW_KEY = f"owner = ${_OWNER + 1} AND identity_key = ${_IDENTITY + 1}"

# The winner gets back only its id (it knows the rest); a loser gets the standing row. A row
# committed by a concurrent claimer after this statement's snapshot is not visible to its own
# read: then the statement returns nothing and the plain read below finds it.
_CLAIM = (
    f"WITH inserted AS (INSERT INTO invocation_receipts ({_LISTED}) VALUES ({_VALUES}) "
    "ON CONFLICT (owner, identity_key) DO NOTHING RETURNING invocation_id) "
    f"SELECT invocation_id, {_NULLS} FROM inserted UNION ALL "
    f"SELECT {_LISTED} FROM invocation_receipts "
    f"WHERE {_ROW_KEY} AND NOT EXISTS (SELECT 1 FROM inserted)"
)
_READ = f"SELECT {_LISTED} FROM invocation_receipts WHERE owner = $1 AND identity_key = $2"


def claim_row(store: Engine, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Insert `row` (values in `COLUMNS` order) unless its `(owner, identity_key)` exists.

    Returns the row that stands, in the same order: `row` itself when this call inserted it.
    """
    import psycopg  # here: the receipts import this module on SQLite too, which has no use for it

    cache = driver.connections_for(store)
    key = (row[_OWNER], row[_IDENTITY])
    for attempt in (1, 2):
        cursor, epoch = cache.take()
        try:
            for observe in driver.observers:
                observe(_CLAIM, True)
            standing = cursor.execute(_CLAIM, row).fetchone()
            if standing is None:
                for observe in driver.observers:
                    observe(_READ, True)
                standing = cursor.execute(_READ, key).fetchone()
        except psycopg.OperationalError as exc:
            # Broken or stale connection: drop it and try once more with the same values.
            cache.drop(cursor)
            if attempt == 2:  # as SQLAlchemy's class: the rounds tell infrastructure by it
                raise driver.store_error(exc, _CLAIM) from exc
            continue
        except psycopg.IntegrityError as exc:
            cache.give(cursor, epoch)
            raise ConstraintViolation(f"the store refused the claim: {exc}") from exc
        except BaseException:
            cache.drop(cursor)
            raise
        cache.give(cursor, epoch)
        if standing is None:  # cannot happen: a claimed row is only deleted once finished
            raise RuntimeError("the claimed identity was not found on read back")
        if standing[1] is None and standing[0] == row[0]:
            return row  # ours: the statement returned only our id
        return _in_utc(standing)
    raise AssertionError("unreachable")


def _in_utc(row: Sequence[Any]) -> tuple[Any, ...]:
    # The driver gives the session's zone; the store's other reads give UTC.
    *head, created_at, updated_at = row
    return (*head, created_at.astimezone(UTC), updated_at.astimezone(UTC))
