"""Console sessions signed out before their cookie expired: the nonces every API process
refuses (`orchestrator.api.signouts` keeps them in memory and reads them again here)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator.store.tables import console_signouts

__all__ = ["record_signout", "signed_out"]


def record_signout(conn: Connection, nonce: str, expires_at: datetime, now: datetime) -> None:
    """Refuse the session `nonce` until `expires_at` (its cookie's own expiry); a session signed
    out twice (two tabs) is recorded once. Rows past their expiry go in the same transaction:
    their cookies are refused for age, so the table holds at most a day of sign-outs."""
    row = {"nonce": nonce, "expires_at": expires_at, "signed_out_at": now}
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(console_signouts)
        .values(row)
        .on_conflict_do_nothing(index_elements=["nonce"])
    )
    conn.execute(delete(console_signouts).where(console_signouts.c.expires_at < now))


def signed_out(conn: Connection, now: datetime) -> frozenset[str]:
    """The nonces of sessions signed out whose cookies have not expired yet."""
    query = select(console_signouts.c.nonce).where(console_signouts.c.expires_at >= now)
    return frozenset(conn.execute(query).scalars())
