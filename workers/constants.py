"""Task and queue names, and the retention pass's schedule, in one place."""

from __future__ import annotations

from typing import Final

__all__ = ["CLEANUP", "CLEANUP_INTERVAL_SECONDS", "QUEUE", "RUN_GENERATION", "SENT_AGAIN", "SWEEP"]

QUEUE: Final = "orchestrator"
RUN_GENERATION: Final = "orchestrator.run_generation"
SWEEP: Final = "orchestrator.sweep"
CLEANUP: Final = "orchestrator.cleanup"

#: How often the sweeper (and `worker --beat`) runs the retention pass (`services/cleanup.py`).
#: Here, not there: the Celery app every trigger and requeue builds would import the cleanup
#: and its store modules for this one number (about 10 ms of each command's start).
CLEANUP_INTERVAL_SECONDS: Final = 3600

#: The header of a wake-up the sweeper sent again (workers/tasks.py reads the store first).
SENT_AGAIN: Final = "orch_sent_again"
