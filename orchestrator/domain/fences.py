"""What a write of an execution must still hold to be applied (DESIGN invariant 9).

A fence is the task id, the execution generation and the lease token that generation was claimed
with. Every write from an execution carries one; the store (`orchestrator.store.fencing`) checks
it in the transaction that applies the write, and refuses it once the generation is no longer the
task's live one, so nothing a superseded or dead generation does afterwards is accepted. It is
shared vocabulary, here so the store, the services and the tools can all name it without the
store depending on the tools.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Fence"]


@dataclass(frozen=True)
class Fence:
    """Who is writing: every write of an execution carries these and the store checks them."""

    task_id: str
    generation: int
    lease_token: str
