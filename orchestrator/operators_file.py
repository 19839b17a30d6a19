"""ORCH_OPERATORS read again when it changes: taking an account out, or its role down, holds
from the next request.

The API used to read the file once, at start-up: an approver taken out of it (a token leaked, a
person left) went on approving until the API restarted. Each request now looks at the file's
modification time, size and inode (one `stat`), and a changed file is read again. A file that
no longer reads (removed, a bad line, no account left) fails closed: every request is refused
with `503 operators_unreadable`, its message naming the line and the kind of problem (never a
hash, nor an account name), until the file is mended; neither the accounts it named before nor
the open API of no accounts at all.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from orchestrator.errors import OrchestratorError
from orchestrator.operators import Account, OperatorsError, load_operators

__all__ = ["OperatorsFile", "OperatorsUnreadable"]

log = logging.getLogger(__name__)


class OperatorsUnreadable(OrchestratorError):
    """The operators file changed and cannot be used: nobody is let in until it is mended."""

    code = "operators_unreadable"
    http_status = 503


_Signature = tuple[int, int, int]


class OperatorsFile:
    """The accounts of one operators file, as it reads now (`accounts`)."""

    def __init__(self, path: Path) -> None:
        """Reads the file; `OperatorsError` when it cannot be used (start-up stops)."""
        self.path = path
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._accounts = load_operators(path)
        self._error: OperatorsError | None = None

    def _signature(self) -> _Signature:
        try:
            found = os.stat(self.path)
        except OSError as exc:
            raise OperatorsError(
                f"cannot read the operators file {self.path}: {exc.strerror}"
            ) from None
        return (found.st_mtime_ns, found.st_size, found.st_ino)

    def accounts(self) -> tuple[Account, ...]:
        """The accounts the file names now; `OperatorsUnreadable` while it cannot be used."""
        try:
            seen: _Signature | None = self._signature()
        except OperatorsError as exc:
            seen, gone = None, exc
        with self._lock:
            if seen is None:
                self._seen, self._error = (-1, -1, -1), gone
            elif seen != self._seen:
                # Stamped with what was seen before the read: a write that lands during it
                # changes the stamp again, and the next request reads the file once more.
                self._seen = seen
                try:
                    self._accounts, self._error = load_operators(self.path), None
                except OperatorsError as exc:
                    self._error = exc
                    log.error("ORCH_OPERATORS changed and cannot be used: %s", exc)
                else:
                    log.info("ORCH_OPERATORS read again: %d account(s)", len(self._accounts))
            if self._error is not None:
                # Said to callers who may hold no token: the line, not where the file lives
                # nor an account name (`OperatorsError.public`).
                why = self._error.public.replace(str(self.path), "ORCH_OPERATORS")
                raise OperatorsUnreadable(
                    f"the operators file cannot be used ({why}); every request is refused "
                    "until it is mended"
                )
            return self._accounts
