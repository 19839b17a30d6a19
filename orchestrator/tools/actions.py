"""`propose_action`: the agent's only way to a work order or a command is a human's approval."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from orchestrator.errors import ConflictError, StaleGeneration, ValidationFailed
from orchestrator.services.actions import ActionService
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = ["ProposeAction"]


class _ActionArguments(ToolArguments):
    node_id: str = Field(min_length=1, max_length=64)
    kind: Literal["work_order", "command"]
    payload: dict[str, Any] = Field(default_factory=dict)


class ProposeAction(Tool):
    name = "propose_action"
    description = (
        "Propose a work order or a command for a node of the saved plan. It is NOT executed: it "
        "waits for a human's approval. The action id is written back to the plan node, which must "
        "be open (pending, running or waiting; complete it after the approval). Propose "
        "before save_report: once this generation saved its report, a proposal is refused with "
        "report_already_saved."
    )
    effect = "internal_write"
    arguments = _ActionArguments

    def __init__(self, actions: ActionService, keeper: LeaseKeeper) -> None:
        self.actions = actions
        self.keeper = keeper

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        assert isinstance(args, _ActionArguments)
        if ctx.fence is None:
            return ToolResult.failed("only a task execution can propose actions", code="no_task")
        self.keeper.check()
        try:
            proposal = self.actions.propose(
                ctx.fence, ctx.session_id, args.node_id, args.kind, args.payload
            )
        except StaleGeneration:
            raise
        except (ValidationFailed, ConflictError) as exc:
            return ToolResult.failed(exc.message, code=exc.code)
        self.keeper.renew_now(mirror=False)
        return ToolResult(
            status="pending",
            payload={
                "action_id": proposal.action.action_id,
                "status": proposal.action.status,
                "plan_revision": proposal.plan_revision,
            },
            message="proposed; it waits for a human's approval and has not been carried out",
        )
