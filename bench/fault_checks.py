"""What bench/faults.py concludes from what it collected: pure functions, no I/O.

- Writes done twice, counted at the receiving end: a write is sent at most once per intent
  round of its task (DESIGN 13-15: an identical write still `running` or `unknown` is verified
  read-only, never resent; only an operator's requeue starts a new intent round, in which a
  finished write may run again).
- Deliveries (DESIGN 24): every approved action reaches the backend with its id as the
  `Idempotency-Key` and its outbox row says delivered; nothing that was not approved reaches
  it; every task event row is delivered and was received, each task's events first arriving in
  `seq` order. A row sent again (its dispatcher killed between the post and its record) carries
  the same delivery id and key: counted, not a failure (applied once by a backend that honours
  the key).
- Fencing (DESIGN 9): no row of generation g is accepted after a later generation of the same
  task started. A later generation is claimed only after the requeue that fenced g committed,
  and a write of g is accepted only before that commit (both take the task row's lock), so a
  row of g that committed after generation g' > g started was accepted through a broken fence.
  A superseded round still running on its old worker is allowed; its writes being kept is not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "Accepted",
    "Duplicate",
    "Late",
    "OutboxRow",
    "Post",
    "delivery_findings",
    "duplicate_writes",
    "late_rows",
]


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


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: str
    kind: str  # action, webhook
    status: str  # pending, delivered, dead, discarded
    action_id: str | None


@dataclass(frozen=True)
class Post:
    """One request the backend received: its path (`actions`, `hooks`), delivery id and
    idempotency key (headers), and an event's task and seq (body)."""

    path: str
    delivery: str | None
    key: str | None
    task_id: str | None = None
    seq: int | None = None


def delivery_findings(
    actions: Iterable[tuple[str, str]], rows: Iterable[OutboxRow], posts: Sequence[Post]
) -> dict[str, object]:
    """`actions` as (action id, status). The lists name what failed; the counters describe."""
    actions, rows = list(actions), list(rows)
    approved = {a for a, status in actions if status == "approved"}
    keys = {p.key for p in posts if p.path == "actions"}
    deliveries = Counter(p.delivery for p in posts)
    action_rows = {r.action_id: r for r in rows if r.kind == "action"}
    events = [r for r in rows if r.kind == "webhook"]
    arrived: dict[str | None, list[int | None]] = {}
    first: set[tuple[str | None, int | None]] = set()
    for post in posts:
        if post.path == "hooks" and (post.task_id, post.seq) not in first:
            first.add((post.task_id, post.seq))
            arrived.setdefault(post.task_id, []).append(post.seq)
    return {
        "actions": Counter(status for _, status in actions),
        "outbox": Counter(f"{r.kind} {r.status}" for r in rows),
        "approved_missing": sorted(approved - keys),
        "approved_undelivered": sorted(
            a for a in approved if a not in action_rows or action_rows[a].status != "delivered"
        ),
        "not_approved_sent": sorted({a for a, status in actions if status != "approved"} & keys),
        "events_undelivered": [r.outbox_id for r in events if r.status != "delivered"],
        "events_unreceived": [
            r.outbox_id for r in events if r.status == "delivered" and not deliveries[r.outbox_id]
        ],
        "out_of_order": sorted(
            str(task) for task, seqs in arrived.items() if seqs != sorted(seqs, key=_seq)
        ),
        "resent": sum(n - 1 for n in deliveries.values() if n > 1),
        "received": len(posts),
    }


def _seq(seq: int | None) -> int:
    return -1 if seq is None else seq
