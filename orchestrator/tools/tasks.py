"""Task tools of an execution: `read_task_context` and `save_report`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from sqlalchemy import Connection

from orchestrator.domain.evidence import Finding, report_problems
from orchestrator.domain.recovery import Snapshot
from orchestrator.domain.times import wire_time
from orchestrator.errors import NotFound
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.recovery import snapshot_for
from orchestrator.store import actions as action_store
from orchestrator.store import evidence as evidence_store
from orchestrator.store import executions as execution_store
from orchestrator.store import reports as report_store
from orchestrator.store import task_plans
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = ["EVIDENCE_SHOWN", "ReadTaskContext", "SaveReport"]


#: How many of the previous generation's evidence records `read_task_context` shows at once,
#: the newest; a generation may leave thousands (each ~300 characters), which filled the
#: model's context window and every request after it. Those its plan and report cite are shown
#: whatever their age: the round's recovery rests on them.
EVIDENCE_SHOWN = 50


class _ContextArguments(ToolArguments):
    evidence_skip: int = Field(
        default=0,
        ge=0,
        # Beyond any generation's records, and within the store's OFFSET (10**30 failed there
        # with an OverflowError that told the model nothing).
        le=1_000_000_000,
        description="Skip this many of the previous generation's newest evidence records "
        "(to read older ones: the answer's evidence_page says what to send).",
    )


class ReadTaskContext(Tool):
    name = "read_task_context"
    description = (
        "The task's context, its origin, the current generation, and what the previous "
        "generation that actually ran left: its report and evidence, and the task's last plan "
        "(which your first plan keeps, every node; an earlier generation's when that one "
        "published none), a generation superseded before it started being skipped; and every "
        "action of the task with its node, status, digest and a human's decision (approver and "
        "note): act on a decision, and do "
        "not propose a rejected action again. When that generation stopped abnormally, "
        "`recovery` comes first: the calls that returned (with receipt ids) and the calls whose "
        "outcome is `unknown`, which you must verify read-only before retrying anything. A "
        "fixed sample input of the trigger comes as `sample_input` with origin "
        "`peripheral_sample`: to cite it, query it with "
        "query_data_source(source='sample_input') and never present it as a live query result."
    )
    effect = "read"
    arguments = _ContextArguments

    def __init__(self, db: Database, *, recovery: bool = True) -> None:
        self.db = db
        # The recovery snapshot is the previous round's tool-call trail, for the execution that
        # resumes it; a collaboration answers from plans, reports and evidence only (seed 004).
        self.recovery = recovery

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        if ctx.task_id is None or ctx.generation is None:
            return ToolResult.failed("this session does not belong to a task", code="no_task")
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, ctx.task_id)
            if task is None:
                raise NotFound(f"task {ctx.task_id} does not exist")
            previous: dict[str, Any] | None = None
            recovery: Snapshot | None = None
            if ctx.generation > 1:
                before = execution_store.last_started_execution(conn, ctx.task_id, ctx.generation)
                if before is not None:
                    recovery = snapshot_for(conn, before) if self.recovery else None
                    # The plan the first publish must keep (invariant 22): the task's latest
                    # before this generation, an earlier one's when `before` published none (it
                    # lost its lease or was requeued first), with the steps people closed in it
                    # meanwhile. `before`'s own session alone showed no plan then, and the
                    # agent could not publish the nodes it was never shown.
                    plan = task_plans.task_latest_plan(conn, ctx.task_id, ctx.generation)
                    previous = {
                        "generation": before.generation,
                        "outcome": before.outcome,
                        "reason": before.reason,
                        "report": report_store.latest_report(conn, ctx.task_id, before.generation),
                        "plan": plan.to_dict() if plan else None,
                    }
                    skip = args.evidence_skip if isinstance(args, _ContextArguments) else 0
                    previous |= _evidence_view(conn, ctx.task_id, before.generation, previous, skip)
            task_actions = [
                _action_view(a) for a in action_store.actions_of_task(conn, task.task_id)
            ]
        payload: dict[str, Any] = {}
        if recovery is not None:
            # First: what the previous generation did and what must be verified read-only.
            payload["recovery"] = recovery.to_dict()
        payload |= {
            "task_id": task.task_id,
            "task_type": task.task_type,
            "title": task.title,
            "origin": task.origin,
            "generation": ctx.generation,
            "session_id": ctx.session_id,
            # The actions before the context and the previous generation: a long result is
            # shown the model as its beginning (the rest paged), and people's decisions must
            # not sit past a large context, a plan and dozens of evidence records.
            "actions": task_actions,
            "context": task.context,
            "previous_generation": previous,
        }
        if task.sample_input is not None:
            # Seed 004: a fixed synthetic input must say so; it is never a live query result.
            payload["sample_input"] = {"origin": "peripheral_sample", "data": task.sample_input}
        return ToolResult.ok(payload)


def _evidence_view(
    conn: Connection, task_id: str, generation: int, previous: dict[str, Any], skip: int
) -> dict[str, Any]:
    """The generation's newest records (after `skip`) and every record its plan and report
    cite (of any generation), oldest first; the count, and how to read older ones."""
    newest, total = report_store.newest_evidence_of(
        conn, task_id, generation, limit=EVIDENCE_SHOWN, skip=skip
    )
    shown = {record["evidence_id"]: record for record in newest}
    cited = [i for i in _cited(previous) if i not in shown]
    shown |= evidence_store.evidence_by_ids(conn, task_id, cited)
    records = sorted(shown.values(), key=lambda r: (r["queried_at"], r["evidence_id"]))
    view: dict[str, Any] = {"evidence_total": total}
    if skip + len(newest) < total:
        view["evidence_page"] = (
            f"the newest {len(newest)} of the generation's {total} records after skipping "
            f"{skip}, and those its plan and report cite; older ones: read_task_context"
            f"(evidence_skip={skip + len(newest)})"
        )
    view["evidence"] = records  # last: the longest part
    return view


def _cited(previous: dict[str, Any]) -> list[str]:
    """The evidence ids the report (its own and its findings') and the plan's nodes cite."""
    report = previous.get("report") or {}
    plan = previous.get("plan") or {}
    cited = [str(i) for i in report.get("evidence_refs") or ()]
    for item in [*(report.get("findings") or ()), *(plan.get("nodes") or ())]:
        if isinstance(item, dict):
            cited += [str(i) for i in item.get("evidence_ids") or ()]
    return list(dict.fromkeys(cited))


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
        "decided_at": wire_time(action.decided_at) if action.decided_at else None,
        "note": action.note,
    }


class FindingArgument(ToolArguments):
    """A finding with what it rests on. `whole_range` says it claims the whole queried range
    ("no anomaly in the last 24 h"); `origin` is how it presents its data (say `live` only
    when every record it rests on is live)."""

    text: str = Field(min_length=1, max_length=2000)
    evidence_ids: list[str] = Field(default_factory=list, max_length=50)
    whole_range: bool = False
    origin: Literal["live", "synthetic", "peripheral_sample"] | None = None


class _ReportArguments(ToolArguments):
    summary: str = Field(min_length=1, max_length=4000)
    findings: list[str | FindingArgument] = Field(default_factory=list, max_length=100)
    evidence_ids: list[str] = Field(default_factory=list, max_length=100)
    presented_origin: Literal["live", "synthetic", "peripheral_sample"] | None = None
    outcome: Literal["completed", "waiting", "failed", "continue"]


class SaveReport(Tool):
    name = "save_report"
    description = (
        "Save this round's report, last, after every plan and action proposal: a summary, "
        "findings, the evidence_ids it rests on (ids the host returned with query results, of "
        "this task, earlier generations included) and the outcome you declare. Origin and "
        "truncation come from the host's records, never from you. A completed report cites at "
        "least one record. A finding is text, or {text, evidence_ids, whole_range, origin}: "
        'whole_range=true claims the whole queried range ("no anomaly in the last 24 h") and '
        "is refused with truncated_evidence if a record it rests on is truncated; presenting "
        "synthetic or peripheral_sample records as live (origin or presented_origin `live`) is "
        "refused with origin_mismatch. After the report, publish_execution_plan and "
        "propose_action are refused with report_already_saved; saving it again replaces it. "
        "A refused report lists every problem and writes nothing."
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
        findings = [
            Finding(f, (), False, None)
            if isinstance(f, str)
            else Finding(f.text, tuple(f.evidence_ids), f.whole_range, f.origin)
            for f in args.findings
        ]
        cited = list(
            dict.fromkeys([*args.evidence_ids, *(i for f in findings for i in f.evidence_ids)])
        )
        with self.db.transaction() as conn:
            check_fence(conn, ctx.fence)
            records = evidence_store.evidence_by_ids(conn, ctx.fence.task_id, cited)
            problems = report_problems(
                outcome=args.outcome,
                cited=args.evidence_ids,
                findings=findings,
                presented_origin=args.presented_origin,
                records=records,
            )
            if problems:
                codes = ", ".join(dict.fromkeys(p["code"] for p in problems))
                return ToolResult.failed(
                    f"the report was refused ({codes}); nothing was written. Fix every problem "
                    "and save it again.",
                    code=problems[0]["code"],
                    payload={"details": problems},
                )
            report = report_store.insert_report(
                conn,
                ctx.fence,
                ctx.session_id,
                summary=args.summary,
                findings=[f if isinstance(f, str) else f.model_dump() for f in args.findings],
                evidence_refs=cited,
                outcome=args.outcome,
            )
        self.keeper.renew_now(mirror=False)
        return ToolResult.ok(dict(report, evidence=[records[i] for i in cited]))
