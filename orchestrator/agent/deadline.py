"""The per-call deadline (`ORCH_TOOL_TIMEOUT_SECONDS`): every tool call ends for the round.

A call that has not returned within its time limit is given up: the turn answers it (a read
`failed`, a write `unknown` and its receipt `unknown`; a write to the orchestrator's own store,
a plan, a proposal or a report, `unknown` too: it may still commit), its thread is left to end
by itself as after a cancel, and the round goes on. It is not a cancel: nothing told the tool
to stop, and the answer says which limit it passed.

`CallWatch` is what the waiting turn and the call's own thread share, under one lock, so that
"given up" and "returned in time" exclude each other: a call given up records nothing when it
returns late (no receipt outcome, no evidence, no metric), and a write given up before its
receipt was claimed never runs. The limit counts from when the call got its worker slot.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from orchestrator.domain.outcomes import model_message
from orchestrator.store.receipts import Receipt
from orchestrator.tools.base import ToolResult

__all__ = ["SETTING", "CallWatch", "timed_out"]

#: The setting named in every answer of a call that was given up.
SETTING: Final = "ORCH_TOOL_TIMEOUT_SECONDS"


class CallWatch:
    """One call's progress: its start, its receipt (writes), and whether it was given up."""

    __slots__ = (
        "_holding",
        "_lock",
        "_slots",
        "given_up",
        "limit",
        "receipt",
        "returned_at",
        "started_at",
    )

    def __init__(self, limit: float | None, slots: threading.BoundedSemaphore) -> None:
        #: Seconds from the start until the call is given up; None = no limit of the host's.
        self.limit = limit
        self._slots = slots
        self._lock = threading.Lock()
        self._holding = False
        self.started_at: float | None = None
        self.receipt: Receipt | None = None
        self.given_up = False
        self.returned_at: float | None = None

    # -- the call's thread ----------------------------------------------------------------------

    def enter(self) -> None:
        """Take a worker slot; the time limit runs from now."""
        self._slots.acquire()
        with self._lock:
            self._holding = True
            self.started_at = time.monotonic()

    def leave(self) -> None:
        """Give the slot back (unless the turn already did, when it gave the call up)."""
        with self._lock:
            if self._holding:
                self._holding = False
                self._slots.release()

    def claimed(self, receipt: Receipt) -> bool:
        """A write's receipt is claimed: False when the call was given up (do not run it)."""
        with self._lock:
            if self.given_up:
                return False
            self.receipt = receipt
            return True

    def returned(self) -> bool:
        """The tool returned: True when in time (record its outcome), False when given up."""
        with self._lock:
            if self.given_up:
                return False
            self.returned_at = time.monotonic()
            return True

    # -- the waiting turn -----------------------------------------------------------------------

    def wake_at(self, now: float) -> float | None:
        """When the turn should look at this call again (None: only when it returns)."""
        if self.limit is None or self.returned_at is not None:
            return None
        started = self.started_at
        # Not started yet (waiting for a slot): its limit starts at the earliest now.
        return (now if started is None else started) + self.limit

    def give_up(self, now: float) -> bool:
        """Give the call up if its time is over and it has not returned; frees its slot."""
        with self._lock:
            if (
                self.limit is None
                or self.given_up
                or self.returned_at is not None
                or self.started_at is None
                or now < self.started_at + self.limit
            ):
                return False
            self.given_up = True
            if self._holding:
                # Left behind, it no longer counts against the turn's concurrency.
                self._holding = False
                self._slots.release()
            return True


def timed_out(tool_name: str, limit: float, *, write: bool, receipt: Receipt | None) -> ToolResult:
    """The answer to a call given up at `limit` seconds: never `succeeded` or `failed` by guess
    for a write, receipted or to the store (seed 000: a timeout after sending is unknown)."""
    said = (
        f"{tool_name} gave no result within {limit:g} s, the host's time limit for a call "
        f"({SETTING}); the host stopped waiting for it (it was not cancelled)."
    )
    if not write:
        return ToolResult.failed(
            f"{said} Nothing was received; narrow the request or try again later.",
            code="tool_timeout",
        )
    return ToolResult(
        status="unknown",
        message=f"{said} {model_message('time_limit')}",
        invocation_id=receipt.invocation_id if receipt is not None else None,
        code="tool_timeout",
        outcome="time_limit",
    )
