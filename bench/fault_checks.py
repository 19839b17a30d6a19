"""What bench/faults.py concludes from what it collected: pure functions, no I/O.

- Writes done twice, counted at the receiving end: a write is sent at most once per intent
  round of its task (DESIGN 13-15: an identical write still `running` or `unknown` is verified
  read-only, never resent; only an operator's requeue starts a new intent round, in which a
  finished write may run again).
- Fencing (DESIGN 9): no row of generation g is accepted after a later generation of the same
  task started. A later generation is claimed only after the requeue that fenced g committed,
  and a write of g is accepted only before that commit (both take the task row's lock), so a
  row of g that committed after generation g' > g started was accepted through a broken fence.
  A superseded round still running on its old worker is allowed; its writes being kept is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Accepted", "Duplicate", "Late", "duplicate_writes", "late_rows"]


@dataclass(frozen=True)
class Duplicate:
    key: str
    received: int
    allowed: int


@dataclass(frozen=True)
class Accepted:
    """A row an execution wrote: what it is, whose, and when it committed."""

    kind: str  # plan, report, transcript, evidence, receipt claim, receipt outcome
    task_id: str
    generation: int
    committed_at: datetime


@dataclass(frozen=True)
class Late:
    row: Accepted
    later_generation: int
    later_started_at: datetime


def duplicate_writes(received: Mapping[str, int], allowed: Mapping[str, int]) -> list[Duplicate]:
    """Keys the backend received more often than the design allows (`allowed[key]`: the intent
    rounds of the task that owns the key; a key nobody owns is allowed once), sorted by key."""
    return [
        Duplicate(key, count, allowed.get(key, 1))
        for key, count in sorted(received.items())
        if count > allowed.get(key, 1)
    ]


def late_rows(
    rows: Iterable[Accepted], starts: Iterable[tuple[str, int, datetime | None]]
) -> list[Late]:
    """Rows committed after a later generation of their task had started.

    `starts` holds (task_id, generation, started_at) for every execution; one never started
    (None) fenced nothing yet. Each late row is reported against the earliest later generation
    that had started before it committed.
    """
    by_task: dict[str, list[tuple[datetime, int]]] = {}
    for task_id, generation, started_at in starts:
        if started_at is not None:
            by_task.setdefault(task_id, []).append((started_at, generation))
    for started in by_task.values():
        started.sort()
    late: list[Late] = []
    for row in rows:
        for started_at, generation in by_task.get(row.task_id, ()):
            if started_at >= row.committed_at:
                break
            if generation > row.generation:
                late.append(Late(row, generation, started_at))
                break
    return late
