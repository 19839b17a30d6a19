"""What the API answers to an operator's change that may queue a generation: a person's step
(`HumanStepOut`) and a write's resolution (`ResolvedView`). Pydantic only: `tasks node --json`
and `invocations resolve --json` print these, and the route modules import FastAPI.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from orchestrator.api.enums import ReceiptStatus, TaskStatus
from orchestrator.api.wire_types import WAKE_UP_DISPATCHED, IsoTime
from orchestrator.services.human_steps import HumanStep
from orchestrator.services.invocations import Resolution

__all__ = ["HumanStepOut", "ResolvedView"]


class HumanStepOut(BaseModel):
    task_id: str
    node_id: str
    status: str
    by: str
    at: IsoTime
    plan_revision: int = Field(description="the revision the step wrote")
    session_id: str
    plan_generation: int | None = Field(
        description="the generation whose plan the step went into: the task's `generation`, "
        "or an earlier one's until the task's generation publishes its own (which keeps it)"
    )
    task_status: str = Field(description="the task's status after the step was re-decided")
    generation: int
    dispatched: bool | None = Field(default=None, description=WAKE_UP_DISPATCHED)

    @classmethod
    def of(cls, step: HumanStep) -> HumanStepOut:
        return cls(
            task_id=step.task_id,
            node_id=step.node_id,
            status=step.status,
            by=step.by,
            at=step.at,
            plan_revision=step.plan.revision,
            session_id=step.plan.session_id,
            plan_generation=step.plan.generation,
            task_status=step.task_status,
            generation=step.generation,
            dispatched=None if step.wake_up is None else step.wake_up.sent,
        )


class ResolvedView(BaseModel):
    invocation_id: str
    tool_name: str
    status: ReceiptStatus = Field(description="the receipt's status now")
    previous_status: ReceiptStatus
    summary: str
    resolved_by: str
    reason: str
    task_id: str
    task_status: TaskStatus = Field(description="the task's status after the resolution")
    generation: int
    queued_generation: int | None = Field(
        description="the generation queued at once when the task waited only on open writes"
    )
    dispatched: bool | None = Field(default=None, description=WAKE_UP_DISPATCHED)

    @classmethod
    def of(cls, resolution: Resolution) -> ResolvedView:
        receipt = resolution.receipt
        return cls(
            invocation_id=receipt.invocation_id,
            tool_name=receipt.tool_name,
            status=ReceiptStatus(receipt.status),
            previous_status=ReceiptStatus(resolution.previous_status),
            summary=receipt.summary,
            resolved_by=resolution.by,
            reason=resolution.reason,
            task_id=resolution.task_id,
            task_status=TaskStatus(resolution.task_status),
            generation=resolution.generation,
            queued_generation=resolution.queued_generation,
            dispatched=None if resolution.wake_up is None else resolution.wake_up.sent,
        )
