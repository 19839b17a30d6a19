"""The line a command prints when Redis did not take what its change sent: the broker the
wake-up of the generation the change queued (`tasks requeue`, `actions approve|reject`, `tasks
node`, `invocations resolve`), or the change notices for task streams and running rounds (those
and `tasks cancel`).

Each of these commits its change first and wakes the generation after (`services/dispatch.py`):
with Redis down the wake-up is refused, recorded in the store, and sent by the next sweep once
the broker is back. The change happened, so the command still exits 0; but no worker starts the
task until then, and before only a log line of the service said so. The trigger says it the same
way and exits 0 too: its task is stored and will run, and a script told otherwise by exit 1
retried it (a second task, without --trigger-id). A change notice Redis refused is a
warning of `orchestrator.events`, worded for a worker's log: a command holds it back
(`held_notices`) and says it in its own words, once, and not at all beside the broker's line
(which already says that Redis takes nothing).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.services.dispatch import WakeUp
    from orchestrator.settings import Settings


__all__ = ["Notices", "held_notices", "quiet_dispatch_log", "say_unsent"]


def quiet_dispatch_log() -> None:
    """`say_unsent` says it in the command's words; the service's warning would repeat it."""
    logging.getLogger("orchestrator.services.dispatch").setLevel(logging.ERROR)


class Notices(logging.Handler):
    """The change notices Redis refused while a command ran: each warning's error. Only the
    command's own, logged on its thread (a change's notices are sent by the thread that
    committed it): another thread of the process, such as an API's subscription to the
    notices in the same process, logs its own troubles, which are not the command's."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[str] = []
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self._thread:
            return
        # The events module logs the exception as the last argument of its warnings.
        args = record.args if isinstance(record.args, tuple) else ()
        cause = args[-1] if args and isinstance(args[-1], BaseException) else None
        self.errors.append(str(cause) if cause is not None else record.getMessage())


@contextmanager
def held_notices() -> Iterator[Notices]:
    """While the command's change is made, the events module's warnings go to the `Notices`
    (for `say_unsent`), not to stderr as a log line beside the command's own."""
    logger = logging.getLogger("orchestrator.events")
    notices, propagate = Notices(), logger.propagate
    logger.addHandler(notices)
    logger.propagate = False
    try:
        yield notices
    finally:
        logger.removeHandler(notices)
        logger.propagate = propagate


def say_unsent(
    wake_up: WakeUp | None,
    task_id: str,
    change: str,
    settings: Settings,
    notices: Notices | None = None,
    *,
    done: str | None = None,
) -> None:
    """One line on stderr when `wake_up` was refused (None: the change queued no generation),
    or else when Redis refused the change's `notices`; nothing when all went out. The errors
    are redacted of the configured secrets. `done` leads the sweeper's part: what stands
    (default `the CHANGE is committed, and`)."""
    from orchestrator.logs import redact, secrets_of

    secrets = secrets_of(settings)
    if wake_up is None or wake_up.sent:
        if notices is not None and notices.errors:
            print(
                f"orchestrator: Redis did not take the notice of the {change} "
                f"({redact(notices.errors[0], secrets)}); the {change} is committed: task "
                "streams show it at their next poll, and a round running elsewhere stops at "
                "its next lease renewal",
                file=sys.stderr,
            )
        return
    why = f" ({redact(wake_up.error, secrets)})" if wake_up.error else ""
    when = (
        "at its first sweep once the broker takes messages again"
        if wake_up.recorded
        else f"after {settings.queued_stale_seconds:g}s (the store did not take the record "
        "that it was not sent)"
    )
    print(
        f"orchestrator: the broker did not take the wake-up of task {task_id} generation "
        f"{wake_up.generation}{why}; {done or f'the {change} is committed, and'} the sweeper "
        f"sends the wake-up {when}",
        file=sys.stderr,
    )
