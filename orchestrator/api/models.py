"""Response models of the public routes: what a generated client gets, with enums for every
closed vocabulary (the plan routes' models: `orchestrator.api.plan_views`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from orchestrator.api.enums import (
    EvidenceOrigin,
    ExecutionOutcome,
    ReceiptStatus,
    SessionPurpose,
    TaskOrigin,
    TaskStatus,
)
from orchestrator.api.explain_views import (
    DeliveriesView,
    PendingActionView,
    RecoveryView,
    ReportView,
    as_text_unless,
)
from orchestrator.api.plan_views import PlanRevisionView
from orchestrator.api.wire_types import IsoTime

__all__ = [
    "EvidenceView",
    "ExecutionView",
    "ExplainView",
    "GenerationUsageView",
    "HandedBackView",
    "InvocationView",
    "LastWrite",
    "LeaseView",
    "RequeuedView",
    "ResolutionView",
    "SessionView",
    "TaskRowView",
    "TaskView",
    "TokenUsageView",
    "TranscriptEntryView",
    "TranscriptPage",
    "TriggerView",
    "UsageTotal",
    "body_as_sent",
]


class HandedBackView(BaseModel):
    """A generation its worker stopped and gave back: nothing runs until the sweeper requeues
    it, though the task's status stays `running` (the generation is still open)."""

    at: IsoTime = Field(description="when the worker handed the generation back")
    requeue_after: IsoTime | None = Field(
        description="the first sweep after this time queues the next generation (a model "
        "server's Retry-After or the back-off; at once after an outage)"
    )
    reason: str | None = Field(description="why, as the execution says it")


class TaskView(BaseModel):
    task_id: str
    task_type: str
    title: str
    status: TaskStatus
    failure_code: str | None
    intent_round: int
    last_error: str | None
    origin: TaskOrigin
    trigger_id: str
    generation: int
    session_id: str | None
    rounds: int
    recoveries: int = Field(
        description="generations lost in a row by a worker that died or stalled "
        "(ORCH_MAX_RECOVERIES parks the task)"
    )
    handbacks: int = Field(
        description="generations in a row their workers handed back after an outage of the "
        "store or Redis, or a model server away or rate limiting (ORCH_MAX_HANDBACKS parks "
        "the task)"
    )
    created_at: IsoTime
    updated_at: IsoTime
    handed_back: HandedBackView | None = Field(
        default=None,
        description="set while the current generation waits, handed back by its worker, for "
        "the sweeper to requeue it: the task reads `running` but no round runs",
    )


class TaskRowView(TaskView):
    """A row of the task list, and the head of a task's view: read from the stored task, which
    an answer to a trigger or a requeue is not (its wake-up is said there as `dispatched`)."""

    wake_up_unsent: bool = Field(
        default=False,
        description="a queued task whose wake-up the broker refused (Redis down): the sweeper "
        "sends it at its first sweep once the broker takes messages again",
    )


class TriggerView(TaskView):
    created: bool = Field(description="false when the trigger_id named an existing task")
    dispatched: bool = Field(
        description="false when the broker did not take the new task's wake-up (Redis down): "
        "the task is stored and queued all the same, and the sweeper sends its wake-up at its "
        "first sweep once the broker takes messages again (the `tasks trigger` CLI's JSON "
        "says the same); for a trigger_id found again (nothing is sent), false while that "
        "task's wake-up is still not sent"
    )


class RequeuedView(TaskView):
    dispatched: bool = Field(
        description="false when the broker did not take the new generation's wake-up (Redis "
        "down): the requeue is committed all the same, and the sweeper sends the wake-up at "
        "its first sweep once the broker takes messages again (the `tasks requeue` CLI says so "
        "in a line)"
    )


class LeaseView(BaseModel):
    holder: str
    expires_at: IsoTime
    last_renewed_at: IsoTime | None
    source: Literal["lease_backend", "store"] = Field(
        description="`store`: the lease back end holds none (Redis restarted empty, flushed or "
        "away) and this is the store's mirror of the running generation's lease; its worker "
        "takes it back at its next renewal, or the sweeper requeues the task once it expires"
    )


class ExecutionView(BaseModel):
    generation: int
    session_id: str
    outcome: ExecutionOutcome | None
    failure_code: str | None
    reason: str | None
    created_at: IsoTime
    started_at: IsoTime | None
    ended_at: IsoTime | None
    worker: str | None
    handed_back_at: IsoTime | None = Field(
        description="when its worker stopped the round on an outage and gave it back"
    )
    queued_because: str | None = Field(
        default=None,
        description="why this generation was queued (a requeue with who asked and why, a "
        "decision, a recovery); null for the first, which the trigger queued",
    )


class LastWrite(BaseModel):
    """The current generation's last fenced write: a working agent writes, a stuck one not."""

    at: IsoTime
    kind: str = Field(description="plan, report, evidence or action")


class UsageTotal(BaseModel):
    calls: int
    prompt_tokens: int
    completion_tokens: int


class GenerationUsageView(UsageTotal):
    generation: int


class TokenUsageView(BaseModel):
    """Prompt and completion tokens per generation and in total."""

    generations: list[GenerationUsageView]
    total: UsageTotal


class ResolutionView(BaseModel):
    """An operator's settlement of one of the task's unknown or pending writes."""

    seq: int = Field(description="the task event that recorded it")
    at: IsoTime
    generation: int | None
    invocation_id: str
    tool_name: str
    previous_status: ReceiptStatus
    resolved_status: ReceiptStatus
    by: str
    note: str


class InvocationView(BaseModel):
    """A write receipt's latest observed status: never its arguments, token or output."""

    invocation_id: str
    owner: str = Field(description="the user or task that owns the call")
    session_id: str | None
    tool_name: str
    status: ReceiptStatus
    summary: str
    created_at: IsoTime
    updated_at: IsoTime


class ExplainView(TaskRowView):
    lease: LeaseView | None
    executions: list[ExecutionView]
    plan: PlanRevisionView | None = Field(
        description="the latest revision of the current session's plan"
    )
    report: ReportView | None = Field(description="the current generation's latest report")
    pending_actions: list[PendingActionView] = Field(
        description="the current generation's actions awaiting approval"
    )
    unknown_receipts: list[InvocationView]
    running_receipts: list[InvocationView] = Field(default_factory=list)
    last_write: LastWrite | None
    waiting_on: str | None = Field(
        default=None,
        description="what a waiting task waits on now: its latest `waiting` event's reason "
        "(an approval or a person's step that leaves it waiting says anew)",
    )
    token_usage: TokenUsageView | None = Field(
        default=None, description="prompt and completion tokens per generation and in total"
    )
    recovery: RecoveryView | None = Field(
        default=None, description="the recovery snapshot the next generation continues from"
    )
    deliveries: DeliveriesView | None = Field(
        default=None, description="the task's outbox deliveries: counts, dead and undelivered"
    )
    resolutions: list[ResolutionView | str] = Field(
        default_factory=list,
        description="operators' resolutions of the task's unknown or pending writes, oldest "
        "first (the newest 50): who (`by`), which write, `previous_status` -> "
        "`resolved_status`, the reason (`note`) and when (`at`); one an older version "
        "recorded in another shape is its JSON text",
    )

    @field_validator("resolutions", mode="before")
    @classmethod
    def _older_resolutions_as_text(cls, resolutions: Any) -> Any:
        if not isinstance(resolutions, list):
            return resolutions
        return [as_text_unless(ResolutionView, resolution) for resolution in resolutions]


class SessionView(BaseModel):
    session_id: str
    purpose: SessionPurpose
    task_id: str | None
    generation: int | None
    owner: str
    title: str
    created_at: IsoTime
    updated_at: IsoTime


class TranscriptEntryView(BaseModel):
    """One entry of the durable transcript: a model turn, a tool-result envelope the model was
    shown, or a compaction summary. `body` is what was recorded (cleaned and bounded)."""

    seq: int = Field(description="the entry's number in its generation's session")
    generation: int | None
    turn: int
    kind: str = Field(description="model_turn, tool_result or summary")
    call_id: str | None = None
    parent_call_id: str | None = Field(
        default=None, description="the delegate call whose sub-agent wrote this entry"
    )
    tool_name: str | None = None
    status: str | None = Field(
        default=None, description="a tool result's status: succeeded, failed, pending or unknown"
    )
    usage: dict[str, int] | None = Field(
        default=None, description="prompt and completion tokens of a model call"
    )
    body: dict[str, Any] | str = Field(
        description="an object; one an older version recorded in another shape is its JSON text"
    )

    @field_validator("body", mode="before")
    @classmethod
    def _older_body_as_text(cls, body: Any) -> Any:
        return body_as_sent(body)


def body_as_sent(body: Any) -> Any:
    """A transcript entry's body as the API sends it: an object, or the JSON text of one an
    older version recorded in another shape (a string stays itself)."""
    return as_text_unless(dict[str, Any], body)


class TranscriptPage(BaseModel):
    """One page of a task's transcript, oldest entry first (the one list shape, plus the task,
    the generation asked for and the token usage)."""

    task_id: str
    generation: int | None = Field(description="the generation asked for; null for all")
    items: list[TranscriptEntryView]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )
    token_usage: TokenUsageView = Field(
        description="prompt and completion tokens per generation and in total"
    )


class EvidenceView(BaseModel):
    """One evidence record, as the host recorded it from what a tool really returned."""

    evidence_id: str
    generation: int
    kind: str | None = Field(description="data_source, call_api or command; null on old records")
    source: str
    queried_at: IsoTime
    params_digest: str | None = Field(description="SHA-256 of the query's canonical parameters")
    content_ref: str
    result_id: str | None = Field(description="the paged full result, while it is kept")
    origin: EvidenceOrigin
    truncated: bool = Field(description="a truncated result supports no claim about the whole")
    row_count: int | None
    char_count: int | None
    summary: str
