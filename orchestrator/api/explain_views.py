"""Response models of the explain view's nested records (`GET /api/v1/tasks/{id}`): the
current generation's report and pending actions, the recovery snapshot the next generation
continues from, and the task's outbox deliveries.

They describe what `services.task_explain.explain` already sends (every time as `wire_time`
text, see `IsoTime`). The route sets `response_model_exclude_unset`, so a key the
record does not have stays absent: a plan node's `action_id`, a finding's `whole_range` in a
report saved before findings had it.

A part of a stored record of another shape than today's (saved by an older version: a status no
longer known, a key missing, a wrong type) is sent as its JSON text rather than failing the
whole view with a 500 (`api.older_shapes.as_text_unless`): a report's finding, a recovery
snapshot's done or unknown call, its generation and its last plan, a pending action's payload
(and, through their own models, a plan's nodes and edges). A string stays itself.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from orchestrator.api.delivery_views import Delivery, DeliveryKind, DeliveryStatus
from orchestrator.api.enums import ActionKind, ActionStatus, EvidenceOrigin, ReportOutcome
from orchestrator.api.older_shapes import as_text_unless, items_as_text_unless, payload_as_sent
from orchestrator.api.plan_views import PlanRevisionView
from orchestrator.api.wire_types import IsoTime

__all__ = [
    "PAYLOAD_DESCRIPTION",
    "DeliveriesView",
    "DoneCallView",
    "FindingView",
    "PendingActionView",
    "RecoveryView",
    "ReportView",
    "Undelivered",
    "UnknownCallView",
    "as_text_unless",
    "payload_as_sent",
]


class FindingView(BaseModel):
    """A finding with what it rests on (a finding may also be plain text)."""

    text: str
    evidence_ids: list[str] = Field(default_factory=list, description="evidence it rests on")
    whole_range: bool = Field(default=False, description="claims the whole queried range")
    origin: EvidenceOrigin | None = Field(default=None, description="how it presents its data")


class ReportView(BaseModel):
    """The current generation's latest report, as the agent saved it."""

    report_id: str
    generation: int
    session_id: str
    summary: str
    findings: list[str | FindingView]
    evidence_refs: list[str] = Field(description="the evidence_ids the report cites")
    outcome: ReportOutcome
    created_at: IsoTime

    @field_validator("findings", mode="before")
    @classmethod
    def _older_findings_as_text(cls, findings: Any) -> Any:
        """A report saved before findings were typed may hold a finding of another shape (any
        JSON value, an origin no longer known): it is sent as its JSON text rather than
        failing the whole view; a single value stored instead of a list is one finding."""
        return items_as_text_unless(FindingView, findings)

    @field_validator("evidence_refs", mode="before")
    @classmethod
    def _older_refs_as_text(cls, refs: Any) -> list[Any]:
        """A reference that is not text (an older report's number or object) is its JSON text."""
        return items_as_text_unless(str, refs)


#: The description of an action's `payload` wherever it is sent.
PAYLOAD_DESCRIPTION = (
    "what the action would do; one an older version stored in another shape than an object "
    "is its JSON text"
)


class PendingActionView(BaseModel):
    """An action of the current generation that awaits an approver's decision."""

    action_id: str
    generation: int
    node_id: str
    kind: ActionKind
    payload: dict[str, Any] | str = Field(description=PAYLOAD_DESCRIPTION)
    digest: str = Field(description="SHA-256 of the canonical {kind, payload}: approve names it")
    status: ActionStatus
    created_at: IsoTime

    @field_validator("payload", mode="before")
    @classmethod
    def _older_payload_as_text(cls, payload: Any) -> Any:
        return payload_as_sent(payload)


class DoneCallView(BaseModel):
    """A tool call of the stopped round that received its result."""

    call_id: str
    tool: str
    turn: int
    status: Literal["succeeded", "failed", "pending"]
    invocation_id: str | None = Field(description="the receipt of a write")


class UnknownCallView(BaseModel):
    """A tool call of the stopped round whose outcome is unknown: verify it before a retry."""

    call_id: str
    tool: str
    turn: int
    status: Literal["unknown"]
    arguments: dict[str, Any] | None = Field(
        description="what the model asked for, redacted for a sensitive operation"
    )
    invocation_id: str | None = Field(description="the receipt of a write")
    why: str


class RecoveryView(BaseModel):
    """What the next generation continues from (seed 000): the calls of the stopped round.

    A snapshot saved by an older version may hold a part of another shape (a done call whose
    status is no longer a result status, a call without its tool, a plan of an older form): that
    part is sent as its JSON text, the rest of the view as usual."""

    generation: int | str | None = Field(description="text only for an older snapshot's value")
    reason: str
    done: list[DoneCallView | str] = Field(
        description="a call of an older or unexpected shape is its JSON text"
    )
    unknown: list[UnknownCallView | str] = Field(
        description="a call of an older or unexpected shape is its JSON text"
    )
    verify_first: str | None = Field(description="the instruction shown while calls are unknown")
    last_plan: PlanRevisionView | str | None = Field(
        description="a plan of an older or unexpected shape is its JSON text"
    )

    @field_validator("done", mode="before")
    @classmethod
    def _older_done_as_text(cls, done: Any) -> list[Any]:
        return items_as_text_unless(DoneCallView, done)

    @field_validator("unknown", mode="before")
    @classmethod
    def _older_unknown_as_text(cls, unknown: Any) -> list[Any]:
        return items_as_text_unless(UnknownCallView, unknown)

    @field_validator("generation", mode="before")
    @classmethod
    def _older_generation_as_text(cls, generation: Any) -> Any:
        return as_text_unless(int | None, generation)

    @field_validator("last_plan", mode="before")
    @classmethod
    def _older_plan_as_text(cls, last_plan: Any) -> Any:
        return as_text_unless(PlanRevisionView | None, last_plan)


class Undelivered(Delivery):
    """A delivery of the task not delivered (nor discarded) yet."""

    waits_behind: int | None = Field(
        default=None,
        description="a pending webhook held back by an earlier event of its task that is "
        "dead-lettered: that row's outbox id (it is sent once that one is retried or discarded)",
    )
    waits_behind_retried: int | None = Field(
        default=None,
        description="a pending webhook held back in order by an earlier event of its task "
        "that failed and is being retried (pending and tried, not dead yet): that row's outbox "
        "id (it is sent once that one is delivered; not a stuck dispatcher)",
    )


class DeliveriesView(BaseModel):
    """The task's outbox deliveries: counts per kind and status, and the first 20 rows that are
    not delivered (pending or dead)."""

    counts: dict[DeliveryKind, dict[DeliveryStatus, int]]
    undelivered: list[Undelivered]
    never_sent: list[DeliveryKind] = Field(
        default_factory=list,
        description="kinds this task has pending of which no delivery in this store is delivered "
        "or dead-lettered: nothing sends them (most likely ORCH_WEBHOOK_URL or "
        "ORCH_ACTIONS_URL is not set where a dispatcher runs), not a dispatcher that is stuck",
    )
