"""Where a generation runs: the process that claimed it, as the claim records it.

Shared vocabulary, here so the store can read and write it without depending on the lease
layer (`orchestrator.leases.process` says how it is taken from this machine and judged gone).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcessIdentity"]


@dataclass(frozen=True)
class ProcessIdentity:
    """Where a generation runs: `started` is `<scope>/<start ticks>`, or None off Linux."""

    host: str
    pid: int
    started: str | None
