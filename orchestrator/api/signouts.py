"""Console sessions signed out: refused by every API process until their cookie would expire.

The console's cookie is signed, not stored (`console_session`), so clearing it in the browser
left a copy good for the rest of its 12 hours. Sign-out now records the cookie's nonce in the
store (`store.console_signouts`); each API process holds the unexpired nonces in memory and
reads them again every few seconds, so a request's check is a set lookup that never waits on
the store (the token check runs on the event loop, ahead of routing). A sign-out on this
process counts here at once; on another replica within `every` seconds.

While the store cannot be read the last known nonces stay in force (logged once per outage):
an API that cannot reach its store serves nothing but its console's static pages anyway.

An account that signs out more than `PER_ACCOUNT` times within a cookie's life (a script in a
loop) has its sign-outs folded into one time (`store.console_signouts`): its sessions signed
in no later than the latest of them are refused, so neither the table nor each process's
read of it grows with the loop.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from orchestrator.api.console_session import Session
from orchestrator.store import console_signouts as signout_store
from orchestrator.store.db import Database
from orchestrator.store.types import utcnow

__all__ = ["REFRESH_SECONDS", "SignOuts"]

log = logging.getLogger(__name__)

#: How often each API process reads the sign-outs again: how long a session signed out on
#: another replica may still be accepted here.
REFRESH_SECONDS = 2.0


class SignOuts:
    """The nonces of the console sessions signed out, as this process knows them."""

    def __init__(self, db: Database, every: float = REFRESH_SECONDS) -> None:
        self.db = db
        self.every = every
        self._lock = threading.Lock()
        self._known: frozenset[str] = frozenset()
        # Per account, the expiry at or before which its sessions are out (folded sign-outs).
        self._before: dict[str, float] = {}
        # This process's own sign-outs, kept beside a read that began before they committed.
        self._mine: dict[str, datetime] = {}
        self._mine_before: dict[str, datetime] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def revoked(self, session: Session) -> bool:
        if session.nonce in self._known:
            return True
        before = self._before.get(session.operator.name)
        return before is not None and session.expires <= before

    def sign_out(self, session: Session) -> None:
        """Refuse `session` from now until its cookie expires; raises the store's error when
        it cannot be recorded."""
        until = datetime.fromtimestamp(session.expires, UTC)
        name = session.operator.name
        with self.db.transaction() as conn:
            folded = signout_store.record_signout(conn, session.nonce, name, until, utcnow())
        with self._lock:
            self._mine[session.nonce] = until
            self._known = self._known | {session.nonce}
            if folded is not None:
                self._mine_before[name] = max(folded, self._mine_before.get(name, folded))
                self._before = _merged(self._before, {name: folded})

    def refresh(self) -> None:
        """Read the unexpired sign-outs again (every replica's)."""
        now = utcnow()
        try:
            with self.db.transaction(readonly=True) as conn:
                stored = signout_store.signed_out(conn, now)
        except SQLAlchemyError as exc:  # an outage, or a schema not yet upgraded
            if not self._failing:
                self._failing = True
                cause = getattr(exc, "orig", None) or exc
                first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
                log.warning(
                    "console sign-outs cannot be read again (%s); the ones known stay refused",
                    first,
                )
            return
        if self._failing:
            self._failing = False
            log.info("console sign-outs read again: the store answers")
        with self._lock:
            self._mine = {nonce: until for nonce, until in self._mine.items() if until >= now}
            self._mine_before = {a: t for a, t in self._mine_before.items() if t >= now}
            self._known = stored.nonces | frozenset(self._mine)
            self._before = _merged({}, stored.before, self._mine_before)

    def start(self) -> None:
        """Read the sign-outs once, then again every `every` seconds on a thread of its own.
        The first read is here, before the API answers: a replica that starts (a restart, a
        rolling deploy) must not accept a signed-out session until its thread gets to it.
        (A store that does not answer is logged, as at every refresh, and the API starts.)"""
        self.refresh()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-signouts", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ends the re-reads; not waited for: a read hanging on a store that does not answer
        must not hold up the API's stop (the thread is a daemon)."""
        self._stop.set()
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.refresh()


def _merged(*times: dict[str, float] | dict[str, datetime]) -> dict[str, float]:
    """Per account the latest of the times given (epoch seconds, as a cookie's expiry)."""
    merged: dict[str, float] = {}
    for each in times:
        for account, at in each.items():
            seconds = at.timestamp() if isinstance(at, datetime) else at
            merged[account] = max(seconds, merged.get(account, seconds))
    return merged
