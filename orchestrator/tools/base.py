"""What a tool is, what it is given, and what it returns.

The host (`orchestrator.agent.host`) validates arguments with the tool's pydantic model, routes
write tools through durable receipts, and always hands the model a `ToolResult` envelope whose
`status` is the host's verdict, separate from the business payload.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Effect",
    "Fence",
    "Tool",
    "ToolArguments",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "ToolStatus",
]

ToolStatus = Literal["succeeded", "failed", "pending", "unknown"]
Effect = Literal["read", "write", "sensitive_read"]


@dataclass(frozen=True)
class Fence:
    """Who is writing: every write of an execution carries these and the store checks them."""

    task_id: str
    generation: int
    lease_token: str


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolContext:
    """Where a call runs: the owner (a user, or `task:<id>` for executions), session and round."""

    owner: str
    session_id: str
    round_id: str
    task_id: str | None = None
    generation: int | None = None
    fence: Fence | None = None
    readonly: bool = False  # sub-agents: no write reaches the host boundary
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """The envelope every tool returns; `payload` is business data and never decides `status`."""

    status: ToolStatus
    payload: Any = None
    message: str | None = None
    invocation_id: str | None = None
    code: str | None = None

    @classmethod
    def ok(cls, payload: Any = None, message: str | None = None) -> ToolResult:
        return cls(status="succeeded", payload=payload, message=message)

    @classmethod
    def failed(cls, message: str, *, code: str = "failed", payload: Any = None) -> ToolResult:
        return cls(status="failed", payload=payload, message=message, code=code)

    def to_message(self) -> dict[str, Any]:
        """The JSON the model sees."""
        body: dict[str, Any] = {"status": self.status}
        if self.code is not None:
            body["code"] = self.code
        if self.message is not None:
            body["message"] = self.message
        if self.invocation_id is not None:
            body["invocation_id"] = self.invocation_id
        if self.payload is not None:
            body["result"] = self.payload
        return body


class ToolArguments(BaseModel):
    """Base of every tool's argument model: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class Tool(ABC):
    """A tool the agent can call. Subclasses set the class attributes and implement `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    effect: ClassVar[Effect] = "read"
    arguments: ClassVar[type[ToolArguments]]

    @abstractmethod
    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        """Do the work; raise only for the unexpected (the host maps exceptions to a status)."""

    def schema(self) -> dict[str, Any]:
        """The definition sent to a model: name, description, JSON schema of the arguments."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.arguments.model_json_schema(),
        }
