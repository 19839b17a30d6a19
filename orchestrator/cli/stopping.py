"""SIGTERM and SIGINT as a request to stop a long-running command, waited on without a lock.

A handler that calls `threading.Event.set()` can hang the process for good: Python runs the
handler in the main thread between two bytecodes, and when those fall inside the main thread's
own `Event.wait()` while it holds the event's lock, `set()` waits for a lock its own thread
holds (python/cpython#126434 tells the same of multiprocessing's Event). The sweeper did that
once in CI, deaf to every SIGTERM after.

Here the handler only sets a flag, and the signal's number reaches a socket that
`signal.set_wakeup_fd` writes from C, so a wait in `select` wakes whenever the signal lands.
The main thread sets `event` when it sees the request, for the threads that stop with it.
"""

from __future__ import annotations

import select
import signal
import socket
import threading
from types import FrameType

__all__ = ["StopSignals"]

_STOPPING = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Installed in the main thread; `wait(seconds)` is True once a stop was asked for."""

    def __init__(self) -> None:
        self.event = threading.Event()  # set by the main thread only, never by the handler
        self._asked = False
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for signum in _STOPPING:
            signal.signal(signum, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self._asked = True  # no lock, no I/O: safe wherever the main thread was

    def wait(self, seconds: float | None) -> bool:
        """Sleep up to `seconds` (None: until asked); True when a stop has been asked for."""
        if not self._asked and not self._drained():
            select.select([self._read], [], [], seconds)
            self._drained()
        if self._asked:
            self.event.set()
        return self._asked

    def _drained(self) -> bool:
        """Read what the wakeup socket holds; True if it says SIGTERM or SIGINT arrived.

        The bytes are the signals' numbers, written before Python runs the handler: a wait that
        ends on them must not depend on when the handler has run.
        """
        try:
            numbers = self._read.recv(64)
        except BlockingIOError:
            return False
        if any(number in _STOPPING for number in numbers):
            self._asked = True
        return self._asked

    def close(self) -> None:
        """Put back the previous wakeup fd; the handlers stay (a late signal is still a stop)."""
        signal.set_wakeup_fd(self._previous_fd)
        self._read.close()
        self._write.close()
