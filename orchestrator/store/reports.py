"""Reports, evidence and action proposals of a generation; every write is fenced by the caller.

Evidence records are written only by the host (`store.evidence`); here they are read."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, insert, select

from orchestrator.domain.fences import Fence
from orchestrator.domain.plans import readable_edges, readable_nodes
from orchestrator.domain.retries import Retries, readable_retries
from orchestrator.domain.times import wire_time
from orchestrator.errors import ConflictError
from orchestrator.store import driver
from orchestrator.store.evidence import public as public_evidence
from orchestrator.store.tables import actions, evidence, plan_revisions, reports
from orchestrator.store.types import stored_list, utcnow

__all__ = [
    "GenerationFacts",
    "ReportAlreadySaved",
    "evidence_of",
    "generation_facts",
    "insert_report",
    "latest_report",
    "newest_evidence_of",
    "pending_actions_of",
    "pending_actions_of_generation",
    "refuse_after_report",
    "report_already_saved",
    "report_saved",
]


class ReportAlreadySaved(ConflictError):
    """Invariant 10: the report is saved last; a plan or action after it is refused.

    Not a `StaleGeneration`: the generation is still live, the agent only sees a failed call.
    """

    code = "report_already_saved"


_REPORT_SAVED = select(
    exists().where(
        reports.c.task_id == bindparam("task_id"), reports.c.generation == bindparam("generation")
    )
)
_INSERT_REPORT = insert(reports).values(
    {column.name: bindparam(column.name) for column in reports.c}
)


def report_saved(conn: Connection, task_id: str, generation: int) -> bool:
    """Has this generation saved a report?"""
    params = {"task_id": task_id, "generation": generation}
    return bool(conn.execute(_REPORT_SAVED, params).scalar())


def refuse_after_report(conn: Connection, fence: Fence, what: str) -> None:
    """Raise `ReportAlreadySaved` if `fence`'s generation saved its report.

    Call it after `check_fence` in the transaction of the write, as a statement of its own: the
    fence locks the task row, and `save_report` takes the same lock, so a report cannot commit
    between check and write, and one that committed while the fence waited is seen here.
    """
    if report_saved(conn, fence.task_id, fence.generation):
        raise report_already_saved(fence, what)


def report_already_saved(fence: Fence, what: str) -> ReportAlreadySaved:
    """The refusal of `what` (a write) after `fence`'s generation saved its report."""
    return ReportAlreadySaved(
        f"generation {fence.generation} already saved its report, which comes last; "
        f"{what} after it is refused and nothing was written"
    )


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
    if conn.dialect.name == "postgresql":  # sent by store.driver: its JSON as text
        driver.fetch(
            conn,
            _INSERT_REPORT,
            {**row, "findings": json.dumps(findings), "evidence_refs": json.dumps(evidence_refs)},
        )
    else:
        conn.execute(_INSERT_REPORT, row)
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
        .order_by(evidence.c.created_at, evidence.c.evidence_id)
    )
    return [_evidence_dict(r._asdict()) for r in rows]


def newest_evidence_of(
    conn: Connection, task_id: str, generation: int, *, limit: int, skip: int = 0
) -> tuple[list[dict[str, Any]], int]:
    """The generation's newest `limit` records after skipping the `skip` newest, oldest first,
    and how many the generation has: a generation of thousands of records is not read whole
    to show a few dozen."""
    mine = (evidence.c.task_id == task_id, evidence.c.generation == generation)
    rows = conn.execute(
        select(evidence)
        .where(*mine)
        .order_by(evidence.c.created_at.desc(), evidence.c.evidence_id.desc())
        .offset(skip)
        .limit(limit)
    )
    records = [_evidence_dict(r._asdict()) for r in rows]
    total = conn.execute(select(func.count()).select_from(evidence).where(*mine)).scalar_one()
    return records[::-1], int(total)


def _evidence_dict(row: dict[str, Any]) -> dict[str, Any]:
    return public_evidence(row)


def pending_actions_of(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    """Every generation's pending actions of a task (the explain view wants
    `pending_actions_of_generation` with the task's current generation)."""
    rows = conn.execute(
        select(actions)
        .where(actions.c.task_id == task_id, actions.c.status == "pending_approval")
        .order_by(actions.c.created_at)
    )
    return _action_dicts(rows)


def pending_actions_of_generation(
    conn: Connection, task_id: str, generation: int
) -> list[dict[str, Any]]:
    """The pending actions of one generation (the task's current one, for the explain view)."""
    rows = conn.execute(
        select(actions)
        .where(
            actions.c.task_id == task_id,
            actions.c.generation == generation,
            actions.c.status == "pending_approval",
        )
        .order_by(actions.c.created_at, actions.c.action_id)
    )
    return _action_dicts(rows)


def _action_dicts(rows: Any) -> list[dict[str, Any]]:
    return [
        {
            "action_id": r.action_id,
            "generation": r.generation,
            "node_id": r.node_id,
            "kind": r.kind,
            "payload": r.payload,
            "digest": r.digest,  # what an approval names
            "status": r.status,
            "created_at": wire_time(r.created_at),
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
        "created_at": wire_time(row["created_at"]),
    }


@dataclass(frozen=True)
class GenerationFacts:
    """What the state decision reads of a generation (DESIGN: only the current one's)."""

    plan_nodes: list[dict[str, Any]] | None  # the session's latest revision, None without plan
    report_outcome: str | None  # the generation's latest report, None without report
    pending_actions: int
    #: The same revision's edges: a revision stored without `plan_retries` is read by them.
    plan_edges: list[dict[str, Any]] | None = None
    #: The same revision's request id (`human:` when a person wrote it).
    plan_request_id: str | None = None
    #: Nodes of the same revision the rules cannot read (not an object, no id): never done.
    unreadable_nodes: int = 0
    #: The same revision's relation of retries (`domain.retries`); None when it was stored
    #: before the relation was kept (the decision then reads the edges).
    plan_retries: Retries | None = None
    #: The same report's summary: a failure it declared is said in its words.
    report_summary: str | None = None


def _of_latest_revision(column: Any, label: str) -> Any:
    """`column` of the session's latest plan revision, as a scalar subquery."""
    return (
        select(column)
        .where(plan_revisions.c.session_id == bindparam("session_id"))
        .order_by(plan_revisions.c.revision.desc())
        .limit(1)
        .scalar_subquery()
        .label(label)
    )


def _of_latest_report(column: Any, label: str) -> Any:
    """`column` of the generation's latest report, as a scalar subquery."""
    return (
        select(column)
        .where(
            reports.c.task_id == bindparam("task_id"),
            reports.c.generation == bindparam("generation"),
        )
        .order_by(reports.c.created_at.desc(), reports.c.report_id.desc())
        .limit(1)
        .scalar_subquery()
        .label(label)
    )


# Built once: read at the end of every round, in the transaction that applies the decision.
_FACTS = select(
    _of_latest_revision(plan_revisions.c.nodes, "plan_nodes"),
    _of_latest_revision(plan_revisions.c.edges, "plan_edges"),
    _of_latest_revision(plan_revisions.c.request_id, "plan_request_id"),
    _of_latest_revision(plan_revisions.c.retries, "plan_retries"),
    _of_latest_report(reports.c.outcome, "report_outcome"),
    _of_latest_report(reports.c.summary, "report_summary"),
    select(func.count())
    .select_from(actions)
    .where(
        actions.c.task_id == bindparam("task_id"),
        actions.c.generation == bindparam("generation"),
        actions.c.status == "pending_approval",
    )
    .scalar_subquery()
    .label("pending_actions"),
)


def generation_facts(
    conn: Connection, task_id: str, generation: int, session_id: str | None
) -> GenerationFacts:
    """The latest plan of `session_id`, the generation's latest report and pending actions."""
    ((nodes, edges, request_id, retries, report_outcome, summary, pending),) = driver.fetch(
        conn, _FACTS, {"task_id": task_id, "generation": generation, "session_id": session_id}
    )
    readable = readable_nodes(nodes)
    return GenerationFacts(
        plan_nodes=readable,
        report_outcome=report_outcome,
        pending_actions=int(pending),
        plan_edges=readable_edges(edges),
        plan_request_id=request_id,
        unreadable_nodes=len(stored_list(nodes)) - len(readable or []),
        plan_retries=readable_retries(retries),
        report_summary=summary,
    )
