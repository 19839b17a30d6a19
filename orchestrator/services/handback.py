"""A round that stopped itself gives its generation back at once: its mirrored lease ends now.

A round that meets the store or Redis away, or loses its lease, stops without writing and leaves
its generation open. The sweeper requeued it only once the lease mirrored in the store ran out:
up to ORCH_LEASE_SECONDS (two minutes by default) after a Postgres restart of a few seconds, for
every round that was running. The worker knows its round stopped, so once its lease is released
it sets the generation's mirrored expiry to now, fenced by its own lease token and only while
the execution is still open (`store.generations.hand_back`): the next sweep requeues it as any
expired lease, with the same compare-and-sets. It also records that the generation was handed
back (`handed_back_at`), so the sweep counts the loss as an outage (`tasks.handbacks`, parked at
ORCH_MAX_HANDBACKS) and not as a worker that died (`tasks.recoveries`, ORCH_MAX_RECOVERIES):
three store outages in a row under a task do not park it as if it crashed its worker. A
round whose lease ran out while Redis answered (its process stalled past the lease:
`LeaseKeeper.lapsed`) is handed back without that mark: a worker lost, counted as the sweep
would have counted it had it come first. A generation that ended meanwhile (a cancel, a
requeue, another sweeper) is left as it is.

The store may still be away when the round stops: the update is tried again on one thread per
process, every `RETRY_SECONDS`, until it lands or the mirror would have run out by itself. A
worker that dies meanwhile leaves the generation to its lease, as before; so does one whose
runtime closes (`close`): the retries stop with it, not a lease later against a closed store.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from sqlalchemy.exc import InterfaceError, OperationalError

from orchestrator.domain.fences import Fence
from orchestrator.store import generations as generation_store
from orchestrator.store.db import Database, cause_line

__all__ = ["RETRY_SECONDS", "HandBack"]

log = logging.getLogger(__name__)

#: How often a hand-back the store refused is tried again.
RETRY_SECONDS = 1.0
#: How long `close` waits for a try under way (a connection to a store that does not answer
#: can take its connect timeout; the thread is a daemon and tries nothing after it).
CLOSE_WAIT_SECONDS = 2.0


@dataclass(frozen=True)
class _Pending:
    fence: Fence
    outage: bool
    until: float  # time.monotonic(): past it the mirror has run out by itself
    after: float = 0.0  # seconds from the hand-back before the sweep may requeue it
    reason: str | None = None  # why, on the execution


class HandBack:
    """The hand-backs of one worker process (one store, one retry thread started on need)."""

    def __init__(self, db: Database, lease_seconds: float) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def give_back(
        self, fence: Fence, *, outage: bool = True, after: float = 0.0, reason: str | None = None
    ) -> bool:
        """End `fence`'s mirrored lease now (or `after` seconds from now: a model server's
        Retry-After), marked handed back after an outage unless `outage` is False, with
        `reason` on the execution when given; True when that landed (or nothing was left to
        end), False when the store was away and a retry is due."""
        ending = _Pending(fence, outage, 0.0, after, reason)
        if self._closed.is_set():
            _left_to_its_lease(fence)
            return False
        if self._try(ending):
            return True
        with self._lock:
            if self._closed.is_set():  # closed during the try
                _left_to_its_lease(fence)
                return False
            until = time.monotonic() + self.lease_seconds
            self._pending[(fence.task_id, fence.generation)] = replace(ending, until=until)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._retry, name="handback", daemon=True)
                self._thread.start()
        return False

    def close(self) -> None:
        """Stop the retries (the runtime closes its store next). What was not handed back is
        left to its mirrored lease, which the sweeper requeues once it runs out."""
        with self._lock:
            self._closed.set()
            thread = self._thread
            left = list(self._pending.values())
            self._pending.clear()
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_SECONDS)
        for item in left:
            _left_to_its_lease(item.fence)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _try(self, ending: _Pending) -> bool:
        fence = ending.fence
        try:
            with self.db.transaction() as conn:
                generation_store.hand_back(
                    conn,
                    fence.task_id,
                    fence.generation,
                    fence.lease_token,
                    outage=ending.outage,
                    after=ending.after,
                    reason=ending.reason,
                )
        except (OperationalError, InterfaceError) as exc:  # the store away: try again
            log.info(
                "generation %s of %s: handing it back waits for the store (%s)",
                fence.generation,
                fence.task_id,
                cause_line(exc),
            )
            return False
        except Exception:  # a bug: the generation is left to its lease, as before
            log.exception("generation %s of %s: not handed back", fence.generation, fence.task_id)
        return True

    def _retry(self) -> None:
        while not self._closed.wait(RETRY_SECONDS):
            with self._lock:
                due = list(self._pending.items())
            for key, item in due:
                if self._closed.is_set():
                    return
                landed = self._try(item)
                with self._lock:
                    if landed or time.monotonic() >= item.until:
                        self._pending.pop(key, None)
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return


def _left_to_its_lease(fence: Fence) -> None:
    log.info(
        "generation %s of %s: left to its lease, which the sweeper requeues",
        fence.generation,
        fence.task_id,
    )
