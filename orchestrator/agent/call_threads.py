"""Daemon threads for tool calls, kept for the next call while they are idle.

Every tool call runs on a thread of its own (`host.ToolHost`): a call that passes its time limit,
or outlives a cancel's grace, is left to end by itself while the round goes on. Starting a
thread per call costs about 75 us of CPU more than handing the call to a thread that waits for
one, so a thread that finished its call waits up to `IDLE_SECONDS` for the next, then ends.

A call never waits for a thread: with none idle, a new one starts (a call left running keeps
its thread; nothing else is held up by it). The threads are daemons, so one left behind never
holds up the worker's exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_SECONDS", "CallThreads"]

#: How long a thread that finished a call waits for the next before it ends.
IDLE_SECONDS = 30.0


class CallThreads:
    """Runs each callable on a daemon thread: an idle one, or a new one."""

    def __init__(self, name: str = "tool", idle_seconds: float = IDLE_SECONDS) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet promised any

    def run(self, call: Callable[[], None]) -> None:
        """Start `call` now, on a thread of its own (it must not raise: nobody would see it)."""
        with self._lock:
            self._work.put(call)
            if self._idle:
                self._idle -= 1  # that thread is promised this call
                return
        threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def idle(self) -> int:
        """How many threads wait for a call (for tests)."""
        with self._lock:
            return self._idle

    def _serve(self) -> None:
        while True:
            try:
                call = self._work.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    # A call put while this thread timed out was promised to an idle thread:
                    # this one, if it is the last, so it takes it rather than end.
                    if self._work.empty() and self._idle:
                        self._idle -= 1
                        return
                continue
            call()
            with self._lock:
                self._idle += 1
