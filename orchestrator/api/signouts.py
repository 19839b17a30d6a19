"""Console sessions signed out: refused by every API process until their cookie would expire.

The console's cookie is signed, not stored (`console_session`), so clearing it in the browser
left a copy good for the rest of its 12 hours. Sign-out now records the cookie's nonce in the
store (`store.console_signouts`); each API process holds the unexpired nonces in memory and
reads them again every few seconds, so a request's check is a set lookup that never waits on
the store (the token check runs on the event loop, ahead of routing). A sign-out on this
process counts here at once; on another replica within `every` seconds.

While the store cannot be read the last known nonces stay in force (logged once per outage):
an API that cannot reach its store serves nothing but its console's static pages anyway.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

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
        # This process's own sign-outs, kept beside a read that began before they committed.
        self._mine: dict[str, datetime] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def revoked(self, nonce: str) -> bool:
        return nonce in self._known

    def sign_out(self, nonce: str, expires_at: float) -> None:
        """Refuse the session `nonce` from now until `expires_at` (its cookie's expiry, epoch
        seconds); raises the store's error when it cannot be recorded."""
        until = datetime.fromtimestamp(expires_at, UTC)
        with self.db.transaction() as conn:
            signout_store.record_signout(conn, nonce, until, utcnow())
        with self._lock:
            self._mine[nonce] = until
            self._known = self._known | {nonce}

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
            self._known = stored | frozenset(self._mine)

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
