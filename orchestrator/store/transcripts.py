"""The durable transcript: model turns and tool-result envelopes, in order, per session.

The writes are fenced by the caller (`check_fence` in the same transaction). Entries are
numbered per session; a session belongs to one generation. Token usage sits on the entries of
the model calls, so the totals per generation and per task are sums over them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Text,
    TextClause,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    type_coerce,
)

from orchestrator.domain.fences import Fence
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.store import driver
from orchestrator.store.fencing import LIVE_CTE, fence_params
from orchestrator.store.tables import (
    recovery_snapshots,
    sessions,
    tasks,
    transcript_entries,
)
from orchestrator.store.types import utcnow

__all__ = [
    "Entry",
    "GenerationUsage",
    "delete_expired_batch",
    "entries_of",
    "entry_count",
    "entry_keys",
    "insert_entries",
    "insert_entries_fenced",
    "next_seq",
    "usage_of",
]


@dataclass(frozen=True)
class Entry:
    """One transcript entry to write (or as read back, with its `seq`)."""

    turn: int
    kind: str  # model_turn | tool_result | summary
    body: dict[str, Any]
    call_id: str | None = None
    tool_name: str | None = None
    status: str | None = None
    parent_call_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seq: int = 0
    generation: int | None = None
    #: The body as JSON text, when the writer has it already (it is not read back): what
    #: both stores write, `body` being then only the value it was written from.
    body_json: str | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "generation": self.generation,
            "turn": self.turn,
            "kind": self.kind,
        }
        for name in ("call_id", "parent_call_id", "tool_name", "status"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.prompt_tokens is not None or self.completion_tokens is not None:
            out["usage"] = {
                "prompt_tokens": self.prompt_tokens or 0,
                "completion_tokens": self.completion_tokens or 0,
            }
        out["body"] = self.body
        return out


@dataclass(frozen=True)
class GenerationUsage:
    generation: int
    calls: int
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {
            "generation": self.generation,
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


def next_seq(conn: Connection, session_id: str) -> int:
    """The number the session's next entry takes."""
    last = conn.execute(
        select(func.max(transcript_entries.c.seq)).where(
            transcript_entries.c.session_id == session_id
        )
    ).scalar()
    return int(last or 0) + 1


def insert_entries(
    conn: Connection,
    *,
    session_id: str,
    task_id: str | None,
    generation: int | None,
    first_seq: int,
    entries: Sequence[Entry],
) -> None:
    """Write `entries` numbered from `first_seq` (the caller fenced the transaction)."""
    # One multi-row INSERT statement: an executemany is a pipeline of statements on psycopg,
    # several times slower for the two or three rows of a turn.
    rows = _rows(session_id, task_id, generation, first_seq, entries)
    for entry, row in zip(entries, rows, strict=True):
        if entry.body_json is not None:
            # The text as it is (a JSON column is text on SQLite), not `body` written again.
            row["body"] = type_coerce(entry.body_json, Text)
    conn.execute(insert(transcript_entries).values(rows))


def _rows(
    session_id: str,
    task_id: str | None,
    generation: int | None,
    first_seq: int,
    entries: Sequence[Entry],
) -> list[dict[str, Any]]:
    now = utcnow()
    return [
        {
            "session_id": session_id,
            "seq": first_seq + offset,
            "task_id": task_id,
            "generation": generation,
            "turn": entry.turn,
            "kind": entry.kind,
            "call_id": entry.call_id,
            "parent_call_id": entry.parent_call_id,
            "tool_name": entry.tool_name,
            "status": entry.status,
            "body": entry.body,
            "prompt_tokens": entry.prompt_tokens,
            "completion_tokens": entry.completion_tokens,
            "created_at": now,
        }
        for offset, entry in enumerate(entries)
    ]


_COLUMNS = [
    "session_id",
    "seq",
    "task_id",
    "generation",
    "turn",
    "kind",
    "call_id",
    "parent_call_id",
    "tool_name",
    "status",
    "body",
    "prompt_tokens",
    "completion_tokens",
    "created_at",
]


def insert_entries_fenced(
    store: Engine,
    fence: Fence,
    *,
    session_id: str,
    first_seq: int | None,
    entries: Sequence[Entry],
) -> int | None:
    """Postgres: the fence check and the insert as ONE statement (one round trip, autocommit,
    sent by `store.driver`).

    The same check as `check_fence`, in a CTE that locks the task row (`FOR UPDATE OF t`): a
    requeue or cancel that commits first makes the row fail the re-checked condition, and
    nothing is inserted. `first_seq=None` numbers the rows after the session's last entry in
    the same statement (a writer's first write reads no `next_seq` of its own). Returns the
    number the next entry takes, or None when the fence refused the write. The SQL text is
    built once per number of rows (a turn writes one to a few), so no statement is compiled
    per write.
    """
    params: dict[str, Any] = {
        **fence_params(fence),
        "session_id": session_id,
        "first_seq": first_seq,
    }
    rows = _rows(session_id, fence.task_id, fence.generation, 0, entries)
    for index, (entry, row) in enumerate(zip(entries, rows, strict=True)):
        for name in _COLUMNS:
            params[f"{name}_{index}"] = row[name]
        params[f"body_{index}"] = entry.body_json or json.dumps(entry.body)
    inserted = [int(seq) for (seq,) in driver.rows(store, _fenced_insert(len(entries)), params)]
    if len(inserted) != len(entries):
        return None
    return max(inserted) + 1


_CASTS = {
    "session_id": "varchar",
    "seq": "integer",
    "task_id": "varchar",
    "generation": "integer",
    "turn": "integer",
    "kind": "varchar",
    "call_id": "varchar",
    "parent_call_id": "varchar",
    "tool_name": "varchar",
    "status": "varchar",
    "body": "jsonb",
    "prompt_tokens": "integer",
    "completion_tokens": "integer",
    "created_at": "timestamptz",
}


@lru_cache(maxsize=16)
def _fenced_insert(rows: int) -> TextClause:
    values = ", ".join(
        "(" + ", ".join(f"CAST(:{name}_{i} AS {_CASTS[name]})" for name in _COLUMNS) + ")"
        for i in range(rows)
    )
    columns = ", ".join(_COLUMNS)
    # `v.seq` is the row's offset (0, 1, ...) after the first number: the given one, or the
    # one after the session's last entry.
    first = (
        "coalesce(CAST(:first_seq AS integer), (SELECT coalesce(max(x.seq), 0) + 1 "
        "FROM transcript_entries x WHERE x.session_id = CAST(:session_id AS varchar)))"
    )
    picked = [f"{first} + v.seq" if c == "seq" else f"v.{c}" for c in _COLUMNS]
    return text(
        LIVE_CTE + f"INSERT INTO transcript_entries ({columns}) "
        f"SELECT {', '.join(picked)} FROM (VALUES {values}) AS v({columns}) "
        "CROSS JOIN live RETURNING seq"
    )


def entries_of(
    conn: Connection,
    *,
    task_id: str | None = None,
    generation: int | None = None,
    session_id: str | None = None,
    after: tuple[int, int] | None = None,
    limit: int | None = None,
) -> list[Entry]:
    """A task's entries (of one generation, or all), or one session's, in order; `after` a
    (generation, seq) already read, at most `limit` of them."""
    t = transcript_entries.c
    query = select(transcript_entries)
    if session_id is not None:
        query = query.where(t.session_id == session_id)
    if task_id is not None:
        query = query.where(t.task_id == task_id)
    if generation is not None:
        query = query.where(t.generation == generation)
    if after is not None:
        query = query.where(_past(after))
    query = query.order_by(t.generation, t.seq)
    if limit is not None:
        query = query.limit(limit)
    rows = conn.execute(query).all()
    return [
        Entry(
            turn=row.turn,
            kind=row.kind,
            body=row.body,
            call_id=row.call_id,
            tool_name=row.tool_name,
            status=row.status,
            parent_call_id=row.parent_call_id,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            seq=row.seq,
            generation=row.generation,
        )
        for row in rows
    ]


def usage_of(conn: Connection, task_id: str) -> list[GenerationUsage]:
    """Token usage per generation of a task (only generations that called the model)."""
    t = transcript_entries.c
    rows = conn.execute(
        select(
            t.generation,
            func.count(t.prompt_tokens),
            func.coalesce(func.sum(t.prompt_tokens), 0),
            func.coalesce(func.sum(t.completion_tokens), 0),
        )
        .where(t.task_id == task_id, t.kind.in_(("model_turn", "summary")))
        .group_by(t.generation)
        .order_by(t.generation)
    ).all()
    return [
        GenerationUsage(int(g), int(calls), int(prompt), int(completion))
        for g, calls, prompt, completion in rows
        if g is not None
    ]


def entry_keys(
    conn: Connection,
    *,
    task_id: str,
    generation: int | None,
    after: tuple[int, int] | None,
    limit: int,
) -> list[tuple[int | None, int]]:
    """The (generation, seq) keys of the entries `entries_of` would read with the same
    arguments, from the (task_id, generation, seq) index alone: an entry is written once and
    never changed, so equal keys are an equal page."""
    t = transcript_entries.c
    query = select(t.generation, t.seq).where(t.task_id == task_id)
    if generation is not None:
        query = query.where(t.generation == generation)
    if after is not None:
        query = query.where(_past(after))
    query = query.order_by(t.generation, t.seq).limit(limit)
    return [(row.generation, row.seq) for row in conn.execute(query)]


def _past(after: tuple[int, int]) -> Any:
    """Entries past the (generation, seq) `after`, in the order the transcript is read."""
    t = transcript_entries.c
    seen_generation, seen_seq = after
    return or_(
        t.generation > seen_generation,
        and_(t.generation == seen_generation, t.seq > seen_seq),
    )


def entry_count(conn: Connection, task_id: str, generation: int | None = None) -> int:
    """How many entries the task (or one generation of it) has, from the index: its token
    usage changes only with it."""
    t = transcript_entries.c
    query = select(func.count()).where(t.task_id == task_id)
    if generation is not None:
        query = query.where(t.generation == generation)
    return int(conn.execute(query).scalar_one())


def delete_expired_batch(conn: Connection, cutoff: datetime, batch_size: int) -> int:
    """Delete up to `batch_size` transcript entries of finished tasks unchanged since `cutoff`.

    Sessions of background executions are never deleted, so their transcripts (and recovery
    snapshots) follow the retention period of their finished task instead. Returns how many
    entries went; the caller repeats until fewer than `batch_size`.
    """
    finished = (
        select(sessions.c.session_id)
        .join(tasks, tasks.c.task_id == sessions.c.task_id)
        .where(
            sessions.c.purpose == "task_execution",
            tasks.c.status.in_(TERMINAL_TASK_STATUSES),
            tasks.c.updated_at < cutoff,
        )
    )
    t = transcript_entries.c
    keys = conn.execute(
        select(t.session_id, t.seq)
        .where(t.session_id.in_(finished), t.created_at < cutoff)
        .order_by(t.session_id, t.seq)
        .limit(batch_size)
    ).all()
    deleted = 0
    for session_id in {key.session_id for key in keys}:
        seqs = [key.seq for key in keys if key.session_id == session_id]
        result = conn.execute(
            delete(transcript_entries).where(t.session_id == session_id, t.seq.in_(seqs))
        )
        deleted += int(result.rowcount)
        conn.execute(
            delete(recovery_snapshots).where(recovery_snapshots.c.session_id == session_id)
        )
    return deleted
