"""Evidence records: what a tool really returned, stamped by the host (DESIGN invariant 21).

A record holds the source, the host's clock, a digest of the parameters, a content reference
(SHA-256 of the full result and, when the result was kept for paging, its `result_id`; never
the body), the origin from the source's declaration, whether the host knows the result was cut,
and row and character counts. Nothing in it comes from the model.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select

from orchestrator.store.tables import evidence
from orchestrator.store.types import utcnow

__all__ = ["EvidenceRow", "evidence_by_ids", "evidence_of_task", "insert_record", "public"]


@dataclass(frozen=True)
class EvidenceRow:
    """One record to insert (the host fills every field)."""

    task_id: str
    generation: int
    session_id: str
    kind: str  # data_source, call_api, command
    source: str
    origin: str
    truncated: bool
    params_digest: str
    content_hash: str
    result_id: str | None
    row_count: int | None
    char_count: int
    summary: str
    queried_at: datetime


def insert_record(conn: Connection, row: EvidenceRow) -> dict[str, Any]:
    now = utcnow()
    values = {
        "evidence_id": str(uuid.uuid4()),
        "task_id": row.task_id,
        "generation": row.generation,
        "session_id": row.session_id,
        "kind": row.kind,
        "source": row.source,
        "queried_at": row.queried_at,
        "content_ref": f"sha256:{row.content_hash}",
        "result_id": row.result_id,
        "params_digest": row.params_digest,
        "origin": row.origin,
        "truncated": row.truncated,
        "row_count": row.row_count,
        "char_count": row.char_count,
        "summary": row.summary,
        "created_at": now,
    }
    conn.execute(insert(evidence), values)
    return public(values)


def evidence_of_task(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(evidence)
        .where(evidence.c.task_id == task_id)
        .order_by(evidence.c.created_at, evidence.c.evidence_id)
    )
    return [public(r._asdict()) for r in rows]


def evidence_by_ids(
    conn: Connection, task_id: str, ids: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """The task's records among `ids` (a record of another task is not found)."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = conn.execute(
        select(evidence).where(evidence.c.task_id == task_id, evidence.c.evidence_id.in_(wanted))
    )
    return {r.evidence_id: public(r._asdict()) for r in rows}


def public(row: dict[str, Any]) -> dict[str, Any]:
    queried_at: datetime = row["queried_at"]
    return {
        "evidence_id": row["evidence_id"],
        "generation": row["generation"],
        "kind": row.get("kind"),
        "source": row["source"],
        "queried_at": queried_at.isoformat(),
        "params_digest": row.get("params_digest"),
        "content_ref": row["content_ref"],
        "result_id": row.get("result_id"),
        "origin": row["origin"],
        "truncated": bool(row["truncated"]),
        "row_count": row.get("row_count"),
        "char_count": row.get("char_count"),
        "summary": row["summary"],
    }
