"""Task and queue names, in one place."""

from __future__ import annotations

from typing import Final

__all__ = ["CLEANUP", "QUEUE", "RUN_GENERATION", "SENT_AGAIN", "SWEEP"]

QUEUE: Final = "orchestrator"
RUN_GENERATION: Final = "orchestrator.run_generation"
SWEEP: Final = "orchestrator.sweep"
CLEANUP: Final = "orchestrator.cleanup"

#: The header of a wake-up the sweeper sent again (workers/tasks.py reads the store first).
SENT_AGAIN: Final = "orch_sent_again"
