"""A task's durable transcript (its model turns, tool calls and results, as recorded), a page at
a time, with the token usage of its generations; and the version of a page the API tags it by.

`TaskService.transcript` and `transcript_version` answer from here, imported when first asked:
a trigger, a requeue or a listing reads no transcript.
"""

from __future__ import annotations

from typing import Any

from orchestrator.domain.cursors import decode_position, encode_position, invalid_cursor
from orchestrator.errors import NotFound, echoed
from orchestrator.store import tasks as task_store
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.db import Database

__all__ = ["transcript", "transcript_version", "usage_view"]


def transcript(
    db: Database,
    task_id: str,
    generation: int | None = None,
    *,
    limit: int | None = None,
    cursor: str | None = None,
) -> dict[str, Any]:
    """The durable transcript of a task (one generation, or all), oldest entry first: one
    page of `limit` entries after `cursor`, or every entry when `limit` is None."""
    after = _transcript_position(cursor, generation)
    with db.transaction(readonly=True) as conn:
        task = task_store.get_task(conn, task_id)
        if task is None:
            raise NotFound(f"task {echoed(task_id)} does not exist")
        if generation is not None and not 1 <= generation <= task.generation:
            raise NotFound(
                f"task {task_id} has no generation {generation} (it is at {task.generation})"
            )
        entries = transcript_store.entries_of(
            conn,
            task_id=task_id,
            generation=generation,
            after=after,
            limit=None if limit is None else limit + 1,
        )
        usage = transcript_store.usage_of(conn, task_id)
    next_cursor = None
    if limit is not None and len(entries) > limit:
        entries = entries[:limit]
        last = entries[-1]
        next_cursor = encode_position(last.generation or 0, last.seq)
    if generation is not None:
        usage = [u for u in usage if u.generation == generation]
    return {
        "task_id": task_id,
        "generation": generation,
        "items": [entry.to_dict() for entry in entries],
        "next_cursor": next_cursor,
        "token_usage": usage_view(usage),
    }


def transcript_version(
    db: Database,
    task_id: str,
    generation: int | None = None,
    *,
    limit: int,
    cursor: str | None = None,
) -> tuple[Any, ...] | None:
    """What `transcript(...)` with the same arguments would answer, summed up from the
    index: the keys of its entries (written once, never changed) and the count of entries
    of the task, or of the generation asked for (its token usage changes only with it).
    None when it would be a 404. Refuses a cursor as `transcript` does."""
    after = _transcript_position(cursor, generation)
    with db.transaction(readonly=True) as conn:
        task = task_store.get_task(conn, task_id)
        if task is None or (generation is not None and not 1 <= generation <= task.generation):
            return None
        keys = transcript_store.entry_keys(
            conn, task_id=task_id, generation=generation, after=after, limit=limit + 1
        )
        count = transcript_store.entry_count(conn, task_id, generation)
    return (generation, limit, after, count, *keys)


def _transcript_position(cursor: str | None, generation: int | None) -> tuple[int, int] | None:
    """The (generation, seq) a transcript page starts after, or `invalid_cursor`."""
    after = decode_position(cursor) if cursor else None
    if after is not None and generation is not None and after[0] != generation:
        raise invalid_cursor()  # a cursor of another generation's pages
    return after


def usage_view(usage: list[transcript_store.GenerationUsage]) -> dict[str, Any]:
    """Token usage per generation and the task's total."""
    return {
        "generations": [u.to_dict() for u in usage],
        "total": {
            "calls": sum(u.calls for u in usage),
            "prompt_tokens": sum(u.prompt_tokens for u in usage),
            "completion_tokens": sum(u.completion_tokens for u in usage),
        },
    }
