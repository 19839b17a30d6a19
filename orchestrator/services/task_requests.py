"""What an operator sends to requeue or cancel a task: one model each, the API's request body
and the CLI's `--reason` and `--by`, so both paths take and refuse the same values.

Pydantic only: the CLI checked its options with these models imported from
`orchestrator.api.tasks`, a route module, which imports FastAPI and Starlette (0.9 s of CPU on
each requeue or cancel, of 2.4 s) for a command that writes to the store.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.domain.storable import FilledText, Name
from orchestrator.services.tasks import CANCELLED

__all__ = ["CancelBody", "RequeueBody"]

#: Who asks, in a body sent with the shared API token (a named account is always its own name).
_BY = Field(
    default=None,
    description="who asks, recorded with the requeue or cancel; only with the shared API "
    "token (an operator account is recorded by its name, whatever this says)",
)


class RequeueBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: FilledText = Field(min_length=1, max_length=500)
    by: Name | None = _BY


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: FilledText = Field(default=CANCELLED, min_length=1, max_length=500)
    by: Name | None = _BY
