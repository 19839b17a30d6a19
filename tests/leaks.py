"""The leak locator: after each test file, what its tests left for the garbage collector.

A resource dropped open (the psycopg connections of an engine never disposed, a socket, a file, a
running subprocess) warns when the garbage collector frees it. Under `filterwarnings = error`
that warning fails whichever test runs when the collector happens to get to it, often in
another file. So once the last test of a file and the file's fixtures are torn down, the
conftest calls `check`: a garbage collection with the warnings (and the exceptions raised in
`__del__`) it sets off recorded, and that test fails in its teardown naming them.

A full collection reads every object of the process. What survives a check is frozen out of
the later collections (`gc.freeze`), so a check reads what the file made, and the process's
automatic collections skip the frozen objects too; the session's last test collects
everything, so an object that outlives its file and is dropped later is found there. With
every collection timed: tests/unit (one process) spent 9.1 s collecting without the locator,
6.0 s with it, 42 s when each check read every object; the 11 outbox files of
tests/integration 29.0 s without, 17.6 s with.

A psycopg connection's own warning names no database; `watch_psycopg` keeps, for each
connection, its database and where it was opened (the test, and the innermost lines of the
project's and the tests' code), told when it is freed open.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import tracemalloc
import warnings
import weakref
from typing import Any

import psycopg

__all__ = ["check", "unfreeze", "watch_psycopg"]

#: Files whose frames say where a connection was opened: the project's and the tests'.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OURS = tuple(os.path.join(_ROOT, part) + os.sep for part in ("orchestrator", "workers", "tests"))
_THIS = os.path.abspath(__file__).removesuffix("c")

#: Connections freed while still open since the last check: "database (opened where)".
_dropped_open: list[str] = []
_lock = threading.Lock()


def watch_psycopg() -> None:
    """Note where each psycopg connection of this process is opened (a few microseconds)."""
    if getattr(psycopg.Connection.__init__, "_orch_watching", False):
        return
    original = psycopg.Connection.__init__

    def noting(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        where = f"{_current_test()}, at {_opened_at()}"
        finalizer = weakref.finalize(self, _freed, self.pgconn, where)
        finalizer.atexit = False

    noting._orch_watching = True  # type: ignore[attr-defined]
    psycopg.Connection.__init__ = noting  # type: ignore[method-assign]


def _freed(pgconn: Any, where: str) -> None:
    """A connection is freed: note it if its libpq connection is still open."""
    if pgconn.status == psycopg.pq.ConnStatus.OK:
        database = pgconn.db.decode(errors="replace")
        with _lock:
            _dropped_open.append(f"psycopg connection to database {database!r} opened in {where}")


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "no test (collection or session)")


def _opened_at(depth: int = 4) -> str:
    """The innermost `depth` frames of the project's or the tests' code, innermost first."""
    lines: list[str] = []
    frame = sys._getframe(2)
    while frame is not None and len(lines) < depth:
        path = frame.f_code.co_filename
        if path.startswith(_OURS) and path != _THIS:
            lines.append(f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(lines) or "code outside the project"


def check(*, last: bool = False) -> list[str]:
    """Collect the garbage made since the last check (every object's, when `last`) and say
    what it set off: warnings, exceptions raised in `__del__`, and each psycopg connection
    freed open since the last check. The objects still alive are frozen out of the next
    collections (`gc.freeze`), the process's own included, until `last` or `unfreeze`."""
    found: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda raised: found.append(_unraisable(raised))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if last:
                gc.unfreeze()
            gc.collect()
            if not last:
                gc.freeze()
    finally:
        sys.unraisablehook = hook
    found[:0] = [_warning(w) for w in caught]
    with _lock:
        found.extend(_dropped_open)
        _dropped_open.clear()
    return found


def unfreeze() -> None:
    """Every object to the collector again (pytest's own last collection, a run cut short)."""
    gc.unfreeze()


def _warning(caught: warnings.WarningMessage) -> str:
    """The warning, and where its object was made when tracemalloc traces (PYTHONTRACEMALLOC=20:
    slower, so not by default)."""
    line = f"{caught.category.__name__}: {caught.message}"
    made = tracemalloc.get_object_traceback(caught.source) if caught.source is not None else None
    if made is not None:
        line += " (made at " + " < ".join(f"{f.filename}:{f.lineno}" for f in reversed(made)) + ")"
    return line


def _unraisable(raised: Any) -> str:
    message = raised.err_msg or "Exception ignored in"
    return f"{message}: {raised.object!r}: {raised.exc_type.__name__}: {raised.exc_value}"
