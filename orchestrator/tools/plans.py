"""`publish_execution_plan` for an execution: the plan service, fenced, renewing the lease."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from orchestrator.domain.plans import SERVER_FIELDS
from orchestrator.errors import ConflictError, StaleGeneration, ValidationFailed
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.plans import PlanService
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = ["PublishExecutionPlan"]


class _PlanArguments(ToolArguments):
    # Loose on purpose: the plan service reports every rule break at once with stable codes.
    request_id: Any = None
    title: Any = None
    reason: Any = None
    nodes: list[Any] = Field(default_factory=list)
    edges: list[Any] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _without_server_fields(cls, data: Any) -> Any:
        """A stored revision sent back (the usual way to keep every node) carries the fields
        the server sets; the service ignores them, so they are not refused here either."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if key not in SERVER_FIELDS}
        return data


class PublishExecutionPlan(Tool):
    name = "publish_execution_plan"
    description = (
        "Publish the whole execution plan (nodes and edges) as a new revision. Keep every node "
        "of the previous revision (in a new generation: of the task's last plan), a completed "
        "node unchanged, every node's actor and action_id; correct a conclusion with a new "
        "review node and say why in reason. A completed node needs evidence, and an agent node "
        "you complete cites in evidence_ids the evidence_id of a query or the invocation_id of "
        "a succeeded write; failed and waiting need a reason. Only a person completes, fails or "
        "skips a human node. A failed node is never reopened: retry it with a new node of the "
        "same actor and an edge from the failed node. The task completes only when every failed "
        "node has a completed retry (a human step's retry is a human node a person closes); an "
        "agent node that no longer applies may be marked skipped or cancelled instead, and a "
        "step that cannot be retried ends the task with save_report outcome failed. A refusal "
        "lists every problem with its code; nothing is written. The same request_id with the "
        "same content returns the stored revision. Publish before save_report: once this "
        "generation saved its report, a publish is refused with report_already_saved."
    )
    effect = "internal_write"
    arguments = _PlanArguments

    def __init__(self, plans: PlanService, keeper: LeaseKeeper) -> None:
        self.plans = plans
        self.keeper = keeper

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        assert isinstance(args, _PlanArguments)
        self.keeper.check()
        payload = args.model_dump()
        try:
            result = self.plans.publish_execution_plan(
                ctx.session_id,
                payload,
                fence=ctx.fence,
                after_commit=self._renew,
            )
        except StaleGeneration:
            raise
        except (ValidationFailed, ConflictError) as exc:
            # A refused publish wrote nothing; the model must fix the plan and publish again.
            return ToolResult.failed(exc.message, code=exc.code, payload={"details": exc.details})
        return ToolResult.ok(result.plan.to_dict())

    def _renew(self, _result: object) -> None:
        self.keeper.renew_now(mirror=False)
