"""Reports, evidence and action proposals of a generation; every write is fenced by the caller."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, func, insert, select

from orchestrator.store.tables import actions, evidence, reports
from orchestrator.store.types import utcnow
from orchestrator.tools.base import Fence

__all__ = [
    "count_pending_actions",
    "evidence_of",
    "insert_report",
    "latest_report",
    "pending_actions_of",
]


def insert_report(
    conn: Connection,
    fence: Fence,
    session_id: str,
    *,
    summary: str,
    findings: list[Any],
    evidence_refs: list[str],
    outcome: str,
) -> dict[str, Any]:
    row = {
        "report_id": str(uuid.uuid4()),
        "task_id": fence.task_id,
        "generation": fence.generation,
        "session_id": session_id,
        "summary": summary,
        "findings": findings,
        "evidence_refs": evidence_refs,
        "outcome": outcome,
        "created_at": utcnow(),
    }
    conn.execute(insert(reports).values(row))
    return _report_dict(row)


def latest_report(conn: Connection, task_id: str, generation: int) -> dict[str, Any] | None:
    row = conn.execute(
        select(reports)
        .where(reports.c.task_id == task_id, reports.c.generation == generation)
        .order_by(reports.c.created_at.desc(), reports.c.report_id.desc())
        .limit(1)
    ).one_or_none()
    return _report_dict(row._asdict()) if row is not None else None


def evidence_of(conn: Connection, task_id: str, generation: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(evidence)
        .where(evidence.c.task_id == task_id, evidence.c.generation == generation)
        .order_by(evidence.c.created_at)
    )
    return [
        {
            "evidence_id": r.evidence_id,
            "source": r.source,
            "queried_at": r.queried_at.isoformat(),
            "content_ref": r.content_ref,
            "origin": r.origin,
            "truncated": r.truncated,
            "summary": r.summary,
        }
        for r in rows
    ]


def count_pending_actions(conn: Connection, task_id: str, generation: int) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(actions)
            .where(
                actions.c.task_id == task_id,
                actions.c.generation == generation,
                actions.c.status == "pending_approval",
            )
        ).scalar_one()
    )


def pending_actions_of(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(actions)
        .where(actions.c.task_id == task_id, actions.c.status == "pending_approval")
        .order_by(actions.c.created_at)
    )
    return [
        {
            "action_id": r.action_id,
            "generation": r.generation,
            "node_id": r.node_id,
            "kind": r.kind,
            "payload": r.payload,
            "status": r.status,
            "created_at": r.created_at.isoformat(),
        }
        for r in rows
    ]


def _report_dict(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "report_id": row["report_id"],
        "generation": row["generation"],
        "session_id": row["session_id"],
        "summary": row["summary"],
        "findings": row["findings"],
        "evidence_refs": row["evidence_refs"],
        "outcome": row["outcome"],
        "created_at": row["created_at"].isoformat(),
    }
