"""Leases in the store's `leases` table: the embedded back end, on SQLite or Postgres.

One row a lease. Taking one is a single upsert that only overwrites a row whose lease expired;
renew and release compare the token in their WHERE clause, so each call is one statement.

Clock: on Postgres every comparison and timestamp uses the server's `statement_timestamp()`, so
a fleet of workers with drifting clocks still agrees on who holds a lease; SQLite has no server,
so there it is this process's UTC wall clock (every SQLite user runs on the same machine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Interval, Row, delete, func, literal, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.sql.dml import ReturningUpdate

from orchestrator.leases.base import (
    LeaseBackend,
    LeaseBackendUnavailable,
    LeaseInfo,
    Renewal,
    check_holder,
    check_name,
    new_token,
    ttl_milliseconds,
)
from orchestrator.store.db import Database
from orchestrator.store.tables import leases
from orchestrator.store.types import UTCDateTime, utcnow

__all__ = ["SqlLeaseBackend"]

T = TypeVar("T")


class SqlLeaseBackend(LeaseBackend):
    """Leases kept in the store. The `Database` belongs to the caller; `close()` leaves it open."""

    def __init__(self, database: Database) -> None:
        if database.dialect not in {"postgresql", "sqlite"}:
            raise ValueError(f"no SQL lease back end for {database.dialect}")
        self._database = database
        self._postgres = database.dialect == "postgresql"

    def _clock(
        self, ttl_seconds: float | None = None
    ) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
        """`now` and `now + ttl` as SQL expressions, from the one clock this dialect uses."""
        ttl = timedelta(0)
        if ttl_seconds is not None:
            ttl = timedelta(milliseconds=ttl_milliseconds(ttl_seconds))
        if self._postgres:
            now: ColumnElement[Any] = func.statement_timestamp(type_=UTCDateTime)
            # Typed as an interval: left to infer, SQLAlchemy would bind it as a timestamp.
            return now, now + literal(ttl, Interval())
        wall = utcnow()
        return literal(wall, UTCDateTime), literal(wall + ttl, UTCDateTime)

    def acquire(self, name: str, holder: str, ttl_seconds: float) -> str | None:
        check_name(name)
        check_holder(holder)
        token = new_token()
        statement = self._taking([(name, token, holder)], ttl_seconds).returning(leases.c.token)

        def run() -> str | None:
            with self._database.transaction() as conn:
                row = conn.execute(statement).one_or_none()
            return None if row is None else str(row.token)

        return self._call(run)

    def renew(self, name: str, token: str, ttl_seconds: float) -> bool:
        check_name(name)
        now, expires = self._clock(ttl_seconds)
        statement = (
            update(leases)
            .where(leases.c.name == name, leases.c.token == token, leases.c.expires_at > now)
            .values(renewed_at=now, expires_at=expires)
        )

        def run() -> bool:
            with self._database.transaction() as conn:
                return conn.execute(statement).rowcount == 1

        return self._call(run)

    def renew_many(self, held: Sequence[tuple[str, str]], ttl_seconds: float) -> list[bool]:
        """Every renewal in one statement; the answer says which (name, token) pairs matched."""
        for name, _ in held:
            check_name(name)
        if not held:
            return []
        statement = self._renewal(list(held), ttl_seconds)

        def run() -> set[tuple[str, str]]:
            with self._database.transaction() as conn:
                return {(row.name, row.token) for row in conn.execute(statement)}

        renewed = self._call(run)
        return [pair in renewed for pair in held]

    def keep_many(
        self,
        held: Sequence[tuple[str, str, str]],
        ttl_seconds: float,
        *,
        take_back: bool = True,
    ) -> list[Renewal]:
        """In one transaction: the renewal of every lease its token holds, then one upsert that
        takes back, with the same token and holder, each of the others nobody holds (its row
        gone or run out); a row another token holds unexpired is left alone (refused). Without
        `take_back`, one read instead of the upsert tells the free ones (`Renewal.FREE`)."""
        for name, _, holder in held:
            check_name(name)
            check_holder(holder)
        if not held:
            return []
        renewing = self._renewal([(n, t) for n, t, _ in held], ttl_seconds)

        def run() -> tuple[set[tuple[str, str]], set[tuple[str, str]], set[str]]:
            with self._database.transaction() as conn:
                renewed = {(row.name, row.token) for row in conn.execute(renewing)}
                rest: dict[str, tuple[str, str]] = {}  # an upsert may not touch a row twice
                for name, token, holder in held:
                    if (name, token) not in renewed:
                        rest.setdefault(name, (token, holder))
                if not rest:
                    return renewed, set(), set()
                if not take_back:
                    now, _ = self._clock()
                    held_now = select(leases.c.name).where(
                        leases.c.name.in_(sorted(rest)), leases.c.expires_at > now
                    )
                    taken_names = set(conn.execute(held_now).scalars())
                    return renewed, set(), set(rest) - taken_names
                free = [(n, t, h) for n, (t, h) in sorted(rest.items())]  # one lock order
                statement = self._taking(free, ttl_seconds).returning(leases.c.name, leases.c.token)
                return renewed, {(row.name, row.token) for row in conn.execute(statement)}, set()

        renewed, taken, free_names = self._call(run)
        answers = []
        for name, token, _ in held:
            if (name, token) in renewed:
                answers.append(Renewal.RENEWED)
            elif (name, token) in taken:
                answers.append(Renewal.TAKEN_BACK)
            elif name in free_names:
                answers.append(Renewal.FREE)
            else:
                answers.append(Renewal.REFUSED)
        return answers

    def _taking(self, rows: list[tuple[str, str, str]], ttl_seconds: float) -> Any:
        """Each (name, token, holder) takes its lease if nobody holds it (no row, or one run
        out). The WHERE is checked against the row as it is once the conflict is locked
        (Postgres) or under the writer lock (SQLite), so of racing takers exactly one wins."""
        now, expires = self._clock(ttl_seconds)
        insert = (postgresql.insert if self._postgres else sqlite.insert)(leases)
        taking = insert.values(
            [
                {
                    "name": name,
                    "token": token,
                    "holder": holder,
                    "acquired_at": now,
                    "renewed_at": now,
                    "expires_at": expires,
                }
                for name, token, holder in rows
            ]
        )
        return taking.on_conflict_do_update(
            index_elements=[leases.c.name],
            set_={
                column: taking.excluded[column]
                for column in ("token", "holder", "acquired_at", "renewed_at", "expires_at")
            },
            where=leases.c.expires_at <= now,
        )

    def _renewal(self, pairs: list[tuple[str, str]], ttl_seconds: float) -> ReturningUpdate[Any]:
        """The renewal of each (name, token) that holds its lease unexpired; it answers which."""
        now, expires = self._clock(ttl_seconds)
        return (
            update(leases)
            .where(tuple_(leases.c.name, leases.c.token).in_(pairs), leases.c.expires_at > now)
            .values(renewed_at=now, expires_at=expires)
            .returning(leases.c.name, leases.c.token)
        )

    def get_many(self, names: Sequence[str]) -> list[LeaseInfo | None]:
        for name in names:
            check_name(name)
        if not names:
            return []
        now, _ = self._clock()
        statement = select(leases).where(leases.c.name.in_(list(names)), leases.c.expires_at > now)

        def run() -> dict[str, LeaseInfo]:
            with self._database.transaction(readonly=True) as conn:
                return {row.name: _info(row) for row in conn.execute(statement)}

        found = self._call(run)
        return [found.get(name) for name in names]

    def release(self, name: str, token: str) -> bool:
        check_name(name)
        now, _ = self._clock()
        # Our own expired row goes too (it would only wait for the next taker), but the answer
        # is True only for a live lease, as in Redis where an expired key is already gone.
        statement = (
            delete(leases)
            .where(leases.c.name == name, leases.c.token == token)
            .returning((leases.c.expires_at > now).label("live"))
        )

        def run() -> bool:
            with self._database.transaction() as conn:
                row = conn.execute(statement).one_or_none()
            return row is not None and bool(row.live)

        return self._call(run)

    def get(self, name: str) -> LeaseInfo | None:
        check_name(name)
        now, _ = self._clock()
        statement = select(leases).where(leases.c.name == name, leases.c.expires_at > now)

        def run() -> LeaseInfo | None:
            with self._database.transaction(readonly=True) as conn:
                row = conn.execute(statement).one_or_none()
            return None if row is None else _info(row)

        return self._call(run)

    def close(self) -> None:
        """Nothing to free: the database is the caller's."""

    @staticmethod
    def _call(operation: Callable[[], T]) -> T:
        try:
            return operation()
        except (OperationalError, InterfaceError) as exc:
            message = f"the store did not answer the lease call: {exc}"
            raise LeaseBackendUnavailable(message) from exc


def _info(row: Row[Any]) -> LeaseInfo:
    return LeaseInfo(
        name=row.name,
        holder=row.holder,
        token=row.token,
        acquired_at=row.acquired_at,
        renewed_at=row.renewed_at,
        expires_at=row.expires_at,
    )
