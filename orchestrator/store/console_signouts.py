"""Console sessions signed out before their cookie expired: the nonces every API process
refuses (`orchestrator.api.signouts` keeps them in memory and reads them again here).

An account keeps at most `PER_ACCOUNT` nonces: its next sign-out folds them into one time per
account (`console_account_signouts.before`), and its sessions expiring no later than that,
i.e. signed in no later than the latest of them, are refused. Before, an account signing in
and out in a loop grew the table, and every API process's read of it every 2 seconds, without
bound. Only such a loop meets the cap: the sign-out of a person, with the account's other
browsers, keeps its nonce alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator.store.tables import console_account_signouts, console_signouts

__all__ = ["PER_ACCOUNT", "SignedOut", "record_signout", "signed_out"]

#: The most sign-outs kept one by one per account (12 hours of them, a cookie's life).
PER_ACCOUNT = 50


@dataclass(frozen=True)
class SignedOut:
    """The unexpired sign-outs: nonces, and per account the expiry at or before which its
    sessions are out."""

    nonces: frozenset[str]
    before: dict[str, datetime]


def record_signout(
    conn: Connection,
    nonce: str,
    account: str,
    expires_at: datetime,
    now: datetime,
    *,
    per_account: int = PER_ACCOUNT,
) -> datetime | None:
    """Refuse the session `nonce` of `account` until `expires_at` (its cookie's own expiry);
    a session signed out twice (two tabs) is recorded once. Past `per_account` nonces of the
    account, they fold into its time instead, returned (None otherwise). Rows past their
    expiry go in the same transaction: their cookies are refused for age, so the table holds
    at most a day of sign-outs."""
    conn.execute(delete(console_signouts).where(console_signouts.c.expires_at < now))
    conn.execute(delete(console_account_signouts).where(console_account_signouts.c.before < now))
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    mine = console_signouts.c.account == account
    kept = conn.execute(select(func.count()).select_from(console_signouts).where(mine))
    if kept.scalar_one() < per_account:
        row = {"nonce": nonce, "expires_at": expires_at, "signed_out_at": now, "account": account}
        conn.execute(
            dialect.insert(console_signouts)
            .values(row)
            .on_conflict_do_nothing(index_elements=["nonce"])
        )
        return None
    # Folded: every session of the account signed in no later than the latest signed out is
    # out (others it had are the price of signing out in a loop), and its nonces are covered.
    before = max(
        expires_at,
        conn.execute(select(func.max(console_signouts.c.expires_at)).where(mine)).scalar_one()
        or expires_at,
    )
    conn.execute(
        dialect.insert(console_account_signouts)
        .values(account=account, before=before)
        .on_conflict_do_update(
            index_elements=["account"],
            set_={"before": before},
            where=console_account_signouts.c.before < before,
        )
    )
    conn.execute(
        delete(console_signouts).where(and_(mine, console_signouts.c.expires_at <= before))
    )
    return before


def signed_out(conn: Connection, now: datetime) -> SignedOut:
    """The sign-outs whose cookies have not expired yet."""
    query = select(console_signouts.c.nonce).where(console_signouts.c.expires_at >= now)
    times = select(console_account_signouts.c.account, console_account_signouts.c.before).where(
        console_account_signouts.c.before >= now
    )
    return SignedOut(
        frozenset(conn.execute(query).scalars()),
        {row[0]: row[1] for row in conn.execute(times)},
    )
