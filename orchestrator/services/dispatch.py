"""How a queued generation is woken: a `Dispatcher` sends the wake-up (Celery in production).

A wake-up the broker did not take (Redis down at the commit) is recorded in the store
(`wake`, `record_unsent`), and the sweeper sends it again at its first sweep once
the broker takes messages, instead of after ORCH_QUEUED_STALE_SECONDS. The record is written on
the failure path only: a wake-up that went out costs no statement.

A change an operator or the backend makes (a requeue, a decision, a person's step, a
resolution) answers with its `WakeUp`, so the CLI and the API say a refused one as the trigger
does: the change is committed all the same, and only its start waits for the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.exc import SQLAlchemyError

from orchestrator.store import tasks as task_store

if TYPE_CHECKING:
    from orchestrator.store.db import Database

__all__ = [
    "Dispatcher",
    "FirstUseDispatcher",
    "RecordingDispatcher",
    "WakeUp",
    "dispatch_failure",
    "dispatch_many",
    "record_unsent",
    "safe_dispatch",
    "safe_dispatch_many",
    "wake",
]

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        """Send a wake-up for `generation` of `task_id`; may raise if the broker is down.

        `again`: the generation was woken before (the sweeper republishing a wake-up it takes
        for lost), so this one may find it claimed: the worker reads the store before it takes
        the lease (services/executions.py). A generation's first wake-up takes the lease first.
        """


class RecordingDispatcher:
    """Keeps wake-ups in a list: for tests and for commands that must not start work."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self.sent_again: list[tuple[str, int]] = []

    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        self.sent.append((task_id, generation))
        if again:
            self.sent_again.append((task_id, generation))


class FirstUseDispatcher:
    """The dispatcher `make` returns, made when the first wake-up is sent: an operator's
    command that sends none (a read, a cancel, a decision that queues nothing) does not import
    Celery, Kombu and redis-py to build it (0.3 s of CPU of each `tasks cancel`), and one that
    sends one sends it as ever. A `RecordingDispatcher` in its place would drop, silently, any
    wake-up such a command came to send. A batch goes one wake-up at a time (no
    `dispatch_many`): the commands that use it send one."""

    def __init__(self, make: Callable[[], Dispatcher]) -> None:
        self._make = make
        self._made: Dispatcher | None = None

    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        if self._made is None:
            self._made = self._make()
        self._made.dispatch(task_id, generation, again=again)


def safe_dispatch(
    dispatcher: Dispatcher, task_id: str, generation: int, *, again: bool = False
) -> bool:
    """Dispatch after a commit; a broker failure is logged, and the sweeper republishes later."""
    return dispatch_failure(dispatcher, task_id, generation, again=again) is None


def dispatch_failure(
    dispatcher: Dispatcher,
    task_id: str,
    generation: int,
    *,
    again: bool = False,
    quiet: bool = False,
    on_error: Callable[[BaseException], None] | None = None,
) -> str | None:
    """`safe_dispatch`, returning why the broker did not take the wake-up (one line: the
    error's type and first line), or None when it did. `quiet`: the caller says it (the
    sweeper, once an outage), so no line here; `on_error` is given the error itself (the
    sweeper tells a Redis that does not answer from one that refuses)."""
    try:
        if again:
            dispatcher.dispatch(task_id, generation, again=True)
        else:  # as before `again` was added: a dispatcher of an earlier shape still works
            dispatcher.dispatch(task_id, generation)
    except Exception as exc:
        reason = _one_line(exc)
        if on_error is not None:
            on_error(exc)
        if not quiet:
            log.warning(
                "wake-up of task %s generation %s not sent (%s); the sweeper republishes it",
                task_id,
                generation,
                reason,
            )
        return reason
    return None


@dataclass(frozen=True)
class WakeUp:
    """What became of the wake-up of a generation a change queued after its commit."""

    generation: int
    #: False when the broker did not take it (Redis down): the change is committed all the same.
    sent: bool = True
    #: Why the broker did not take it (the error's type and first line), when it did not.
    error: str | None = None
    #: False when the store did not take the record of the refusal either: the sweeper then
    #: republishes the wake-up after ORCH_QUEUED_STALE_SECONDS, not at its first sweep.
    recorded: bool = True


def wake(
    db: Database, dispatcher: Dispatcher, task_id: str, generation: int, *, again: bool = False
) -> WakeUp:
    """Send the wake-up of `generation`; one the broker did not take is recorded in the store
    for the next sweep (`record_unsent`)."""
    failure = dispatch_failure(dispatcher, task_id, generation, again=again)
    if failure is None:
        return WakeUp(generation)
    recorded = record_unsent(db, [(task_id, generation)])
    return WakeUp(generation, sent=False, error=failure, recorded=recorded)


def record_unsent(db: Database, wakeups: list[tuple[str, int]]) -> bool:
    """Record, in one transaction, that these wake-ups were not sent; False when the store did
    not take the record either (then nothing is written, and the sweeper takes them for lost
    after ORCH_QUEUED_STALE_SECONDS, as before the record)."""
    if not wakeups:
        return True
    try:
        with db.transaction() as conn:
            task_store.record_unsent(conn, wakeups)
    except SQLAlchemyError as exc:
        log.warning(
            "%d unsent wake-up(s) not recorded either (%s); the sweeper republishes them after "
            "ORCH_QUEUED_STALE_SECONDS",
            len(wakeups),
            _one_line(exc),
        )
        return False
    return True


def safe_dispatch_many(dispatcher: Dispatcher, wakeups: list[tuple[str, int]]) -> list[bool]:
    """Dispatch a batch after its commit: over one broker connection when the dispatcher can."""
    return dispatch_many(dispatcher, wakeups)[0]


def dispatch_many(
    dispatcher: Dispatcher,
    wakeups: list[tuple[str, int]],
    *,
    quiet: bool = False,
    on_error: Callable[[BaseException], None] | None = None,
) -> tuple[list[bool], str | None]:
    """`safe_dispatch_many`, with why the broker did not take (the first) one, or None when it
    took them all; `quiet` and `on_error` as for `dispatch_failure`."""
    many = getattr(dispatcher, "dispatch_many", None)
    if many is None or len(wakeups) < 2:
        failures = [
            dispatch_failure(dispatcher, t, g, quiet=quiet, on_error=on_error) for t, g in wakeups
        ]
        return [f is None for f in failures], next((f for f in failures if f), None)
    try:
        many(wakeups)
    except Exception as exc:
        reason = _one_line(exc)
        if on_error is not None:
            on_error(exc)
        if not quiet:
            # As for one wake-up: one line, no traceback (before, a sweep's batch logged one).
            log.warning(
                "a batch of %d wake-ups was not (entirely) sent (%s); the sweeper republishes them",
                len(wakeups),
                reason,
            )
        return [False] * len(wakeups), reason
    return [True] * len(wakeups), None


def _one_line(exc: BaseException) -> str:
    """Why the broker did not take a wake-up: the error's type and first line. The broker's
    text names the host, never a password."""
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
