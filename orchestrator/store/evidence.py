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

from sqlalchemy import (
    ARRAY,
    Connection,
    Engine,
    String,
    any_,
    bindparam,
    func,
    insert,
    select,
    text,
)

from orchestrator.domain.fences import Fence
from orchestrator.domain.times import wire_time
from orchestrator.store import driver
from orchestrator.store.fencing import LIVE_CTE, fence_params
from orchestrator.store.keyset import past
from orchestrator.store.records import driver_row
from orchestrator.store.tables import evidence
from orchestrator.store.types import utcnow

__all__ = [
    "EvidenceRow",
    "content_ref",
    "evidence_by_ids",
    "evidence_count",
    "evidence_keys",
    "evidence_of_task",
    "evidence_page",
    "insert_record",
    "insert_record_fenced",
    "keyed_evidence",
    "public",
]


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
    values = _values(row)
    conn.execute(insert(evidence), values)
    return public(values)


def insert_record_fenced(store: Engine, fence: Fence, row: EvidenceRow) -> dict[str, Any] | None:
    """Postgres: the fence check and the insert as one statement (`fencing.LIVE_CTE`), sent in
    autocommit by `store.driver`: one round trip instead of BEGIN, check, insert, COMMIT. None
    when the fence refused the write (nothing was inserted)."""
    values = _values(row)
    inserted = driver.rows(store, _FENCED_INSERT, {**fence_params(fence), **values})
    return public(values) if inserted else None


_CASTS = {
    "evidence_id": "varchar",
    "task_id": "varchar",
    "generation": "integer",
    "session_id": "varchar",
    "kind": "varchar",
    "source": "varchar",
    "queried_at": "timestamptz",
    "content_ref": "varchar",
    "result_id": "varchar",
    "params_digest": "varchar",
    "origin": "varchar",
    "truncated": "boolean",
    "row_count": "integer",
    "char_count": "integer",
    "summary": "text",
    "created_at": "timestamptz",
}

# Built once: the text is the same for every record.
_FENCED_INSERT = text(
    LIVE_CTE
    + f"INSERT INTO evidence ({', '.join(_CASTS)}) SELECT "
    + ", ".join(f"CAST(:{name} AS {cast})" for name, cast in _CASTS.items())
    + " FROM live RETURNING evidence_id"
)


def content_ref(content_hash: str) -> str:
    """The content reference of a record: the SHA-256 of what the tool returned."""
    return f"sha256:{content_hash}"


def _values(row: EvidenceRow) -> dict[str, Any]:
    now = utcnow()
    return {
        "evidence_id": str(uuid.uuid4()),
        "task_id": row.task_id,
        "generation": row.generation,
        "session_id": row.session_id,
        "kind": row.kind,
        "source": row.source,
        "queried_at": row.queried_at,
        "content_ref": content_ref(row.content_hash),
        "result_id": row.result_id,
        "params_digest": row.params_digest,
        "origin": row.origin,
        "truncated": row.truncated,
        "row_count": row.row_count,
        "char_count": row.char_count,
        "summary": row.summary,
        "created_at": now,
    }


def evidence_of_task(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(evidence)
        .where(evidence.c.task_id == task_id)
        .order_by(evidence.c.created_at, evidence.c.evidence_id)
    )
    return [public(r._asdict()) for r in rows]


def evidence_page(
    conn: Connection,
    task_id: str,
    *,
    limit: int,
    after: tuple[datetime, str] | None = None,
    ids: Iterable[str] | None = None,
) -> tuple[list[dict[str, Any]], tuple[datetime, str] | None]:
    """Up to `limit` of the task's records (only those among `ids` when given), oldest first,
    after the (created_at, evidence_id) `after`; and that key of the last one when more follow.

    Read from the (task_id, created_at, evidence_id) index (migration 0019): a page reads its
    own rows, not the thousands before it."""
    rows = keyed_evidence(conn, task_id, limit=limit + 1, after=after, ids=ids)
    page = rows[:limit]
    last = page[-1][0] if len(rows) > limit else None
    return [record for _, record in page], last


def keyed_evidence(
    conn: Connection,
    task_id: str,
    *,
    limit: int,
    after: tuple[datetime, str] | None = None,
    ids: Iterable[str] | None = None,
    newest_first: bool = False,
) -> list[tuple[tuple[datetime, str], dict[str, Any]]]:
    """Up to `limit` of the task's records after `after` in the order asked, each with its
    (created_at, evidence_id) key: what a reader that merges or continues them needs."""
    query = select(evidence).where(evidence.c.task_id == task_id)
    if ids is not None:
        query = query.where(evidence.c.evidence_id.in_(sorted(set(ids))))
    if after is not None:
        query = query.where(
            past(evidence.c.created_at, evidence.c.evidence_id, after, newest_first=newest_first)
        )
    order: list[Any] = [evidence.c.created_at, evidence.c.evidence_id]
    if newest_first:
        order = [column.desc() for column in order]
    rows = conn.execute(query.order_by(*order).limit(limit))
    return [((row.created_at, row.evidence_id), public(row._asdict())) for row in rows]


def evidence_keys(
    conn: Connection,
    task_id: str,
    *,
    limit: int,
    after: tuple[datetime, str] | None = None,
    ids: Iterable[str] | None = None,
) -> list[tuple[datetime, str]]:
    """The (created_at, evidence_id) keys of the records `evidence_page` would read with
    `limit`, from the index alone: a record never changes, so equal keys are an equal page."""
    query = select(evidence.c.created_at, evidence.c.evidence_id).where(
        evidence.c.task_id == task_id
    )
    if ids is not None:
        query = query.where(evidence.c.evidence_id.in_(sorted(set(ids))))
    if after is not None:
        query = query.where(
            past(evidence.c.created_at, evidence.c.evidence_id, after, newest_first=False)
        )
    query = query.order_by(evidence.c.created_at, evidence.c.evidence_id).limit(limit + 1)
    return [(row.created_at, row.evidence_id) for row in conn.execute(query)]


def evidence_count(conn: Connection, task_id: str) -> int:
    """How many records the task has (from the index, not the rows)."""
    query = select(func.count()).select_from(evidence).where(evidence.c.task_id == task_id)
    return int(conn.execute(query).scalar_one())


def evidence_by_ids(
    conn: Connection, task_id: str, ids: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """The task's records among `ids` (a record of another task is not found)."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    statement = _BY_IDS_ANY if conn.dialect.name == "postgresql" else _BY_IDS
    rows = driver.fetch(conn, statement, {"task_id": task_id, "ids": wanted})
    found = (vars(driver_row(_COLUMNS, row)) for row in rows)
    return {row["evidence_id"]: public(row) for row in found}


# Built once (a statement built per call costs more to construct and key than to send); the
# ids are one parameter: an array on Postgres (sent by store.driver), an expanding list else.
_BY_IDS = select(evidence).where(
    evidence.c.task_id == bindparam("task_id"),
    evidence.c.evidence_id.in_(bindparam("ids", expanding=True)),
)
_BY_IDS_ANY = select(evidence).where(
    evidence.c.task_id == bindparam("task_id"),
    evidence.c.evidence_id == any_(bindparam("ids", type_=ARRAY(String))),
)
_COLUMNS = tuple(column.name for column in evidence.c)


def public(row: dict[str, Any]) -> dict[str, Any]:
    queried_at: datetime = row["queried_at"]
    return {
        "evidence_id": row["evidence_id"],
        "generation": row["generation"],
        "kind": row.get("kind"),
        "source": row["source"],
        "queried_at": wire_time(queried_at),
        "params_digest": row.get("params_digest"),
        "content_ref": row["content_ref"],
        "result_id": row.get("result_id"),
        "origin": row["origin"],
        "truncated": bool(row["truncated"]),
        "row_count": row.get("row_count"),
        "char_count": row.get("char_count"),
        "summary": row["summary"],
    }
