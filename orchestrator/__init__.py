"""condition-orchestrator: agent-driven condition tasks on a Celery worker fleet."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
