"""Task and queue names, in one place."""

from __future__ import annotations

from typing import Final

__all__ = ["CLEANUP", "QUEUE", "RUN_GENERATION", "SWEEP"]

QUEUE: Final = "orchestrator"
RUN_GENERATION: Final = "orchestrator.run_generation"
SWEEP: Final = "orchestrator.sweep"
CLEANUP: Final = "orchestrator.cleanup"
