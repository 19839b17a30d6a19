"""A worker process that leaves with rounds still running stops them first and hands them back.

Celery's cold shutdown (Ctrl+C twice, SIGQUIT) cannot kill a thread of the threads pool: its main
thread leaves while the rounds go on. Python then closes every thread pool to new work
(`concurrent.futures`' own exit hook), so a round that went on failed at its next tool call or
transcript write (`cannot schedule new futures after shutdown`) and its task was parked `failed`
for good: a task lost to a stop the operator asked for, after waiting out the model's turn. A
warm shutdown (SIGTERM, one Ctrl+C) never gets here with a round running: Celery waits for them.

So when the main thread leaves, before Python closes the thread pools, every generation the
process still holds is stopped as a lost lease stops it: its round saves its recovery snapshot
and hands the generation back (the next sweep requeues it, counted in `handbacks`), and the exit
waits for those rounds to end, at most `STOP_WAIT_SECONDS`. A round still running then is left
to restart recovery or its lease, as after a SIGKILL.

The hook is `threading._register_atexit`: the only one that runs when the main thread ends and
before the non-daemon threads are joined (`atexit` runs after). Such hooks run last registered
first, so one registered after `concurrent.futures.thread` is imported runs before its hook.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours is registered after)
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.services.lease_keeper import heartbeat

__all__ = [
    "STOP_WAIT_SECONDS",
    "announce_warm_shutdown",
    "install",
    "round_in_flight",
    "stop_rounds",
    "stop_rounds_now",
]

log = logging.getLogger(__name__)

#: How long the exit waits for the stopped rounds: a tool call is abandoned 2 s after the stop,
#: the snapshot's writes wait at most 5 s each.
STOP_WAIT_SECONDS = 15.0

_changed = threading.Condition()
_in_flight = 0
_installed = False


@contextmanager
def round_in_flight() -> Iterator[None]:
    """Counts a wake-up's run while it lasts, so that the exit knows what it waits for."""
    global _in_flight
    with _changed:
        _in_flight += 1
    try:
        yield
    finally:
        with _changed:
            _in_flight -= 1
            _changed.notify_all()


def announce_warm_shutdown() -> None:
    """Say what a warm shutdown waits for: Celery's own line does not, and a round may take
    many model turns."""
    with _changed:
        running = _in_flight
    if running:
        log.warning(
            "warm shutdown: waiting for %d running round(s) to end; a second Ctrl+C or SIGQUIT "
            "stops them now and hands their generations back",
            running,
        )


def install() -> None:
    """Register the exit hook in this (worker) process; once."""
    global _installed
    with _changed:
        if _installed:
            return
        _installed = True
    threading._register_atexit(stop_rounds)  # type: ignore[attr-defined]


def stop_rounds_now() -> None:
    """Stop the rounds still running without waiting for them: for the solo pool, whose one
    round runs on the thread that stops it (it hands back once this returns), and the threads
    pool's cold stop, which runs in a signal handler (the exit hook waits for them)."""
    stopped = heartbeat().stop_all(_WHY)
    if stopped:
        log.warning(
            "the worker is stopping with %d round(s) running: stopping them and handing their "
            "generations back",
            stopped,
        )


#: Why a round stopped, in its lines and its recovery snapshot.
_WHY = "the worker process is shutting down"


def stop_rounds(wait_seconds: float = STOP_WAIT_SECONDS) -> int:
    """Stop the rounds still running and wait for them to end; how many did not end in time."""
    with _changed:
        running = _in_flight
    if not running:
        return 0
    log.warning(
        "the worker is leaving with %d round(s) still running: stopping them and handing "
        "their generations back",
        running,
    )
    started = time.monotonic()
    deadline = started + wait_seconds
    while True:
        # Again on every pass: a wake-up that claimed its generation meanwhile stops too.
        heartbeat().stop_all(_WHY)
        with _changed:
            _changed.wait_for(
                lambda: _in_flight == 0, timeout=min(0.5, max(0.0, deadline - time.monotonic()))
            )
            left = _in_flight
        if not left or time.monotonic() >= deadline:
            break
    if left:
        log.warning(
            "%d round(s) did not stop within %gs; their generations wait for the restart of a "
            "worker on this host, or their leases",
            left,
            wait_seconds,
        )
    else:
        log.warning(
            "%d round(s) stopped and handed back in %.1fs", running, time.monotonic() - started
        )
    return left
