"""What an operator sends to decide an action, close a person's step, resolve a write, or retry
or discard a delivery: one model each, the API's request body and the CLI's options, so both
paths take and refuse the same values (a requeue's and a cancel's are in `task_requests`).

Pydantic only: the CLI checked its options with these models imported from the API's route
modules (`api.actions`, `api.human_steps`, `api.invocations`, `api.outbox`), which import
FastAPI and Starlette: 0.5 s of CPU of each `actions approve`, `tasks node` or `outbox retry`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from orchestrator.domain.storable import FilledText, Name, filled_text, storable_text
from orchestrator.services.invocations import REASON_MAX

__all__ = [
    "STEP_TEXT_MAX",
    "CloseBody",
    "CompleteBody",
    "Decision",
    "DiscardBody",
    "ResolveBody",
    "RetryBody",
]

#: A decision's note.
_DecisionNote = Annotated[str, StringConstraints(max_length=2000), AfterValidator(storable_text)]
#: Why a delivery is retried, or what was mended.
_RetryNote = Annotated[
    str, StringConstraints(min_length=1, max_length=500), AfterValidator(filled_text)
]


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: Name | None = Field(
        default=None,
        description="who decides; with operator accounts the authenticated name is used instead",
    )
    note: _DecisionNote | None = None
    digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the digest being approved (required to approve, optional to reject)",
    )


#: The most a person's evidence or reason for a human step may hold (the console's fields
#: take as much: `STEP_TEXT_MAX` in console/task_plan.js, checked by a browser test).
STEP_TEXT_MAX = 1500


class CompleteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: Name | None = Field(default=None, description="who did it")
    evidence: FilledText = Field(
        min_length=1, max_length=STEP_TEXT_MAX, description="what the person found"
    )


class CloseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: Name | None = Field(default=None, description="who did it")
    reason: FilledText = Field(
        min_length=1, max_length=STEP_TEXT_MAX, description="why it failed or is skipped"
    )


class ResolveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["succeeded", "failed"] = Field(description="what really happened")
    reason: FilledText = Field(
        min_length=1, max_length=REASON_MAX, description="how the operator knows"
    )
    by: Name | None = Field(default=None, description="who resolves it")


class DiscardBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: FilledText = Field(
        min_length=1, max_length=500, description="why: how the delivery was dealt with by hand"
    )
    by: Name | None = Field(
        default=None,
        description="who discards it; required with the shared API token (an operator account "
        "is recorded by its name)",
    )


class RetryBody(BaseModel):
    """Optional: who retries (the shared token's `by`) and a note, kept on the row."""

    model_config = ConfigDict(extra="forbid")
    note: _RetryNote | None = Field(default=None, description="why, or what was mended")
    by: Name | None = Field(
        default=None,
        description="who retries it, with the shared API token (recorded as `api` when not "
        "said); an operator account is recorded by its name",
    )
