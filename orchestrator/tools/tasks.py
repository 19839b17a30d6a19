"""Task tools of an execution: `read_task_context` and `save_report`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, Field

from orchestrator.errors import NotFound
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.store import actions as action_store
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = ["ReadTaskContext", "SaveReport"]


class _NoArguments(ToolArguments):
    pass


class ReadTaskContext(Tool):
    name = "read_task_context"
    description = (
        "The task's context, its origin, the current generation, and what the previous "
        "generation that actually ran left: its last plan, report and evidence (a generation "
        "superseded before it started is skipped), and every action of the task with its node, "
        "status, digest and a human's decision (approver and note): act on a decision, and do "
        "not propose a rejected action again. A fixed sample input of the trigger comes "
        "as `sample_input` with origin `peripheral_sample`: cite it as such, never as a live "
        "query result."
    )
    effect = "read"
    arguments = _NoArguments

    def __init__(self, db: Database) -> None:
        self.db = db

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        if ctx.task_id is None or ctx.generation is None:
            return ToolResult.failed("this session does not belong to a task", code="no_task")
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, ctx.task_id)
            if task is None:
                raise NotFound(f"task {ctx.task_id} does not exist")
            previous: dict[str, Any] | None = None
            if ctx.generation > 1:
                before = task_store.last_started_execution(conn, ctx.task_id, ctx.generation)
                if before is not None:
                    plan = plan_store.latest_revision(conn, before.session_id)
                    previous = {
                        "generation": before.generation,
                        "outcome": before.outcome,
                        "reason": before.reason,
                        "plan": plan.to_dict() if plan else None,
                        "report": report_store.latest_report(conn, ctx.task_id, before.generation),
                        "evidence": report_store.evidence_of(conn, ctx.task_id, before.generation),
                    }
            task_actions = [
                _action_view(a) for a in action_store.actions_of_task(conn, task.task_id)
            ]
        payload: dict[str, Any] = {
            "task_id": task.task_id,
            "task_type": task.task_type,
            "title": task.title,
            "context": task.context,
            "origin": task.origin,
            "generation": ctx.generation,
            "session_id": ctx.session_id,
            "previous_generation": previous,
            "actions": task_actions,
        }
        if task.sample_input is not None:
            # Seed 004: a fixed synthetic input must say so; it is never a live query result.
            payload["sample_input"] = {"origin": "peripheral_sample", "data": task.sample_input}
        return ToolResult.ok(payload)


def _action_view(action: action_store.ActionRecord) -> dict[str, Any]:
    """An action as the agent reads it: what was proposed, and what a person decided."""
    return {
        "action_id": action.action_id,
        "generation": action.generation,
        "node_id": action.node_id,
        "kind": action.kind,
        "payload": action.payload,
        "digest": action.digest,
        "status": action.status,
        "decision": {"approved": "approved", "rejected": "rejected"}.get(action.status),
        "approver": action.decided_by,
        "decided_at": action.decided_at.isoformat() if action.decided_at else None,
        "note": action.note,
    }


class EvidenceItem(ToolArguments):
    """One query result the report rests on (DESIGN §2 evidence, invariant 12)."""

    source: str = Field(min_length=1, max_length=128)
    queried_at: AwareDatetime
    content_ref: str = Field(min_length=1, max_length=255)
    origin: Literal["live", "synthetic", "peripheral_sample"]
    truncated: bool
    summary: str = Field(min_length=1, max_length=4000)


class _ReportArguments(ToolArguments):
    summary: str = Field(min_length=1, max_length=4000)
    findings: list[Any] = Field(default_factory=list, max_length=100)
    evidence_refs: list[str] = Field(default_factory=list, max_length=100)
    evidence: list[EvidenceItem] = Field(default_factory=list, max_length=100)
    outcome: Literal["completed", "waiting", "failed", "continue"]


class SaveReport(Tool):
    name = "save_report"
    description = (
        "Save this round's report, last, after every plan and action proposal: a summary, "
        "findings, evidence references, the evidence items it rests on and the outcome you "
        "declare. After it, publish_execution_plan and propose_action are refused with "
        "report_already_saved; saving the report again replaces it (the latest one counts). "
        "Each evidence item gives source, queried_at (with a time zone), content_ref, origin "
        "(live, synthetic or peripheral_sample: never call a sample or synthetic input live) "
        "and truncated. A truncated item covers only the part it returned and cannot support "
        'a claim about the whole range ("no anomaly in the last 24 h"): outcome completed '
        "is refused with truncated_evidence while every evidence item of this generation is "
        "truncated; query the rest, or declare continue or waiting. A refused report writes "
        "nothing."
    )
    effect = "internal_write"
    arguments = _ReportArguments

    def __init__(self, db: Database, keeper: LeaseKeeper) -> None:
        self.db = db
        self.keeper = keeper

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        assert isinstance(args, _ReportArguments)
        if ctx.fence is None:
            return ToolResult.failed("only a task execution can save a report", code="no_task")
        self.keeper.check()
        items = [item.model_dump() for item in args.evidence]
        with self.db.transaction() as conn:
            check_fence(conn, ctx.fence)
            # Invariant 12, over the generation's evidence (what the next generation and the
            # operators see): a completed outcome needs at least one untruncated item, unless
            # the generation recorded no evidence at all (then it claims nothing from a query).
            if args.outcome == "completed":
                flags = report_store.evidence_truncated_flags(
                    conn, ctx.fence.task_id, ctx.fence.generation
                ) + [item["truncated"] for item in items]
                if flags and all(flags):
                    return ToolResult.failed(
                        "every evidence item of this generation is truncated, so it cannot "
                        "support a completed outcome (a claim about the whole range); query the "
                        "rest, or declare continue or waiting. Nothing was written.",
                        code="truncated_evidence",
                    )
            stored_evidence = report_store.insert_evidence(conn, ctx.fence, ctx.session_id, items)
            report = report_store.insert_report(
                conn,
                ctx.fence,
                ctx.session_id,
                summary=args.summary,
                findings=args.findings,
                evidence_refs=args.evidence_refs,
                outcome=args.outcome,
            )
        self.keeper.renew_now(mirror=False)
        return ToolResult.ok(dict(report, evidence=stored_evidence))
