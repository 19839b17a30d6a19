"""Celery's threads pool, whose cold shutdown stops the running rounds and hands them back.

A cold shutdown (Ctrl+C twice, SIGQUIT) cancels every running request by killing its job, which
Celery's threads pool cannot do: it raised `NotImplementedError ... does not implement
kill_job`, logged as an `Unrecoverable error` with a traceback, and then either waited for every
round as a warm shutdown does (the second Ctrl+C was ignored) or, when the first one's warm
shutdown was already under way, let the main thread leave while the rounds ran on (see
`workers.shutdown`: they failed their tasks).

Here a thread is not killed (nobody can), and a cancelled request's job is left alone; when the
cold shutdown stops the pool, every round of the process is stopped as a lost lease stops it:
it saves its recovery snapshot and hands its generation back, and the process's exit waits for
that, at most `workers.shutdown.STOP_WAIT_SECONDS` (not the signal handler: see `on_stop`). A
warm shutdown (SIGTERM, one Ctrl+C) is unchanged: it waits for the rounds to end.

`SoloPool` does the same for `--pool solo`, whose round runs on the main thread itself.
`workers.celery_app` makes these the `threads` and `solo` pools, for `orchestrator worker` and
`celery -A workers.celery_app worker` alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.concurrency import solo, thread
from celery.concurrency.base import BasePool
from celery.worker import state

from workers import shutdown

__all__ = ["SoloPool", "ThreadPool"]


class _Applied(thread.ApplyResult):  # type: ignore[misc]  # Celery is untyped
    def terminate(self, signum: int | None = None) -> None:
        """A thread cannot be killed: the pool's cold stop stops the round instead."""


class ThreadPool(thread.TaskPool):  # type: ignore[misc]  # Celery is untyped
    """The threads pool; a cold shutdown hands the rounds back (see the module)."""

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """A cancelled request's thread is left to the cold stop (`on_stop`)."""

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> _Applied:
        applied = super().on_apply(target, args, kwargs, callback, accept_callback)
        return _Applied(applied.f)

    def on_stop(self) -> None:
        # A cold shutdown sets `should_terminate` before it stops the pool; a warm one does
        # not, and waits for the rounds (Celery's own stop joins the pool's threads).
        if not state.should_terminate:
            super().on_stop()
            return
        # The cold stop runs in a signal handler, on a main thread it may have interrupted
        # while that held a lock the rounds need as they stop (logging's, when the second
        # Ctrl+C came while the first was logging): waiting for them here deadlocked, and so
        # did joining the pool's threads. The rounds are told to stop, nothing is joined, and
        # the wait happens in the exit hook (`workers.shutdown.install`), once the handler
        # has unwound.
        shutdown.stop_rounds_now()
        self.executor.shutdown(wait=False, cancel_futures=True)
        BasePool.on_stop(self)

    def on_terminate(self) -> None:
        shutdown.stop_rounds_now()  # the exit hook waits for them (see `on_stop`)
        super().on_terminate()


class SoloPool(solo.TaskPool):  # type: ignore[misc]  # Celery is untyped
    """The solo pool: its one round runs on the main thread, which the cold shutdown's signal
    handler interrupts; Celery's `kill_job` raised there, into the round, and failed its task
    (`agent error: ... does not implement kill_job`). Here the round is told to stop and hands
    its generation back once the handler returns."""

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        shutdown.stop_rounds_now()
