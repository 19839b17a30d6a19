"""The line a command prints when the broker did not take the wake-up of the generation its
change queued (`tasks requeue`, `actions approve|reject`, `tasks node`, `invocations resolve`).

Each of these commits its change first and wakes the generation after (`services/dispatch.py`):
with Redis down the wake-up is refused, recorded in the store, and sent by the next sweep once
the broker is back. The change happened, so the command still exits 0; but no worker starts the
task until then, and before only a log line of the service said so. The trigger, whose whole
point is the start, says the same as an error (`tasks.py`).
"""

from __future__ import annotations

import logging
import sys

from orchestrator.logs import redact, secrets_of
from orchestrator.services.dispatch import WakeUp
from orchestrator.settings import Settings

__all__ = ["quiet_dispatch_log", "say_unsent"]


def quiet_dispatch_log() -> None:
    """`say_unsent` says it in the command's words; the service's warning would repeat it."""
    logging.getLogger("orchestrator.services.dispatch").setLevel(logging.ERROR)


def say_unsent(wake_up: WakeUp | None, task_id: str, change: str, settings: Settings) -> None:
    """One line on stderr when `wake_up` was refused (None: the change queued no generation);
    nothing when it went out. The broker's error is redacted of the configured secrets."""
    if wake_up is None or wake_up.sent:
        return
    why = f" ({redact(wake_up.error, secrets_of(settings))})" if wake_up.error else ""
    when = (
        "at its first sweep once the broker takes messages again"
        if wake_up.recorded
        else f"after {settings.queued_stale_seconds:g}s (the store did not take the record "
        "that it was not sent)"
    )
    print(
        f"orchestrator: the broker did not take the wake-up of task {task_id} generation "
        f"{wake_up.generation}{why}; the {change} is committed, and the sweeper sends the "
        f"wake-up {when}",
        file=sys.stderr,
    )
