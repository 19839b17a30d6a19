"""What a tool is, what it is given, and what it returns.

The host (`orchestrator.agent.host`) validates arguments with the tool's pydantic model, routes
write tools through durable receipts, and always hands the model a `ToolResult` envelope whose
`status` is the host's verdict, separate from the business payload.
"""

from __future__ import annotations

import functools
import json
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.fences import Fence

__all__ = [
    "CALL_ID",
    "Effect",
    "Identity",
    "Tool",
    "ToolArguments",
    "ToolCall",
    "ToolCancelled",
    "ToolContext",
    "ToolResult",
    "ToolStatus",
]

#: The key of `ToolContext.extras` under which the host passes a tool its own call id (only to
#: tools that set `wants_call_id`).
CALL_ID = "call_id"

ToolStatus = Literal["succeeded", "failed", "pending", "unknown"]
# `internal_write`: a fenced write to the orchestrator's own store (plans, reports, actions);
# idempotent there, so it needs no receipt, and a read-only agent may not call it.
Effect = Literal["read", "write", "sensitive_read", "internal_write"]
#: How the host deduplicates a write: `intent` = one identity per (owner, session, round, tool,
#: canonical arguments), for business writes; `call` = the tool-call id, for ordinary tools.
Identity = Literal["intent", "call"]


class ToolCancelled(BaseException):  # like CancelledError: not caught as an Exception
    """The round was cancelled while a tool ran; the host records `unknown` and re-raises."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any]
    #: The name as the model sent it, when the host resolved it to `name` (a gpt-oss server's
    #: leaked `functions.NAME` or `NAME<|channel|>commentary`: `agent.tool_names`).
    sent_name: str | None = None
    #: The harmony markers a gpt-oss server left around the arguments, which the host cut to
    #: read them (`{"after": "<|call|>"}`: `agent.argument_markers`).
    sent_markers: dict[str, str] | None = None


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
    #: Set by the agent loop to cancel the round; long-running tools poll it.
    cancel: threading.Event | None = None

    @property
    def intent_scope(self) -> str:
        """What identical writes are merged within: a task's whole life (all its generations
        and sessions) for executions, the session for a chat."""
        return self.owner if self.task_id is not None else self.session_id


@dataclass(frozen=True)
class ToolResult:
    """The envelope every tool returns; `payload` is business data and never decides `status`."""

    status: ToolStatus
    payload: Any = None
    message: str | None = None
    invocation_id: str | None = None
    code: str | None = None
    #: What happened, as an `orchestrator.domain.outcomes.Outcome` (host-side, never shown);
    #: lets the host record the precise fixed summary on the receipt.
    outcome: str | None = None
    #: The evidence record the host wrote for this result (set by the host, never by a tool).
    evidence_id: str | None = None
    #: When the host recorded it and the reference of the content (set with `evidence_id`).
    queried_at: str | None = None
    content_ref: str | None = None
    #: The payload before the host cut it to a preview for the model (host-side, never shown):
    #: the agent keeps a published plan whole in its own message.
    unpaged: Any = None
    #: `payload` and its JSON text (`json.dumps(payload, ensure_ascii=False, default=str)`),
    #: when the tool or the host wrote it already to measure it (never shown): the message is
    #: made from that text while `payload` is still that object, not by writing the payload
    #: again (a query's answer is ~15 KB). See `with_payload_text`.
    payload_text: tuple[Any, str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def ok(cls, payload: Any = None, message: str | None = None) -> ToolResult:
        return cls(status="succeeded", payload=payload, message=message)

    @classmethod
    def failed(cls, message: str, *, code: str = "failed", payload: Any = None) -> ToolResult:
        return cls(status="failed", payload=payload, message=message, code=code)

    def with_payload_text(self, text: str) -> ToolResult:
        """This result, knowing `text` is its payload's JSON text (a payload that is not a
        string: a string payload's text is its JSON string, not itself)."""
        return replace(self, payload_text=(self.payload, text))

    def written_payload(self) -> str | None:
        """The payload's JSON text if it was written already (`payload_text`), else None."""
        written = self.payload_text
        return written[1] if written is not None and written[0] is self.payload else None

    def to_message(self) -> dict[str, Any]:
        """The JSON the model sees."""
        body: dict[str, Any] = {"status": self.status}
        if self.code is not None:
            body["code"] = self.code
        if self.message is not None:
            body["message"] = self.message
        if self.invocation_id is not None:
            body["invocation_id"] = self.invocation_id
        if self.evidence_id is not None:
            body["evidence_id"] = self.evidence_id
        if self.queried_at is not None:
            body["queried_at"] = self.queried_at
        if self.content_ref is not None:
            body["content_ref"] = self.content_ref
        if self.payload is not None:
            body["result"] = self.payload
        return body

    @functools.cached_property
    def message_text(self) -> str:
        """`to_message()` as the JSON text the model is sent, serialised once per result: the
        loop's tool message and the transcript keep exactly this text."""
        body = self.to_message()
        written = self.written_payload()
        if written is None or "result" not in body:
            return json.dumps(body, default=str, ensure_ascii=False)
        # The same text: the payload is written with the same settings wherever it sits, and
        # it is the last key ("status" always comes first, so the head is never empty).
        del body["result"]
        head = json.dumps(body, default=str, ensure_ascii=False)
        return head[:-1] + ', "result": ' + written + "}"


class ToolArguments(BaseModel):
    """Base of every tool's argument model: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class Tool(ABC):
    """A tool the agent can call. Subclasses set the class attributes and implement `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    effect: ClassVar[Effect] = "read"
    arguments: ClassVar[type[ToolArguments]]
    identity: ClassVar[Identity] = "call"
    #: False for tools whose results must not be cached for paging (e.g. the pager itself).
    pageable: ClassVar[bool] = True
    #: True for tools that need their call id (`ctx.extras[CALL_ID]`), e.g. to nest a transcript.
    wants_call_id: ClassVar[bool] = False
    #: A quick read of the orchestrator's own records that changes nothing (a receipt's
    #: status): it runs before the turn's other calls, whose results then have the room its
    #: answer leaves, and a turn whose context window has no room for its answer runs it all
    #: the same, and shows its answer when that takes no more room than `no_room` would
    #: (`orchestrator.agent.turn_room`).
    look_up: ClassVar[bool] = False
    #: Arguments whose values the host keeps as `***` wherever it writes the call down (the
    #: transcript, the recovery snapshot): a command's environment often carries a credential.
    secret_arguments: ClassVar[frozenset[str]] = frozenset()

    def effect_for(self, args: Any) -> Effect:
        """The effect of this call; multi-operation tools (the API gateway) decide per call."""
        return self.effect

    def read_uses(self) -> str | None:
        """What a read-only agent (a sub-agent) may do with this tool, in a few words, or None.
        The host names these in its refusals; the sub-agent's tool list holds only these."""
        return self.name if self.effect == "read" else None

    def time_limit(self, args: Any, default: float) -> float | None:
        """How long the host waits for this call before giving it up: `default`
        (ORCH_TOOL_TIMEOUT_SECONDS), or longer for a tool that bounds the call itself (a
        command's own timeout); None for a tool made only of calls the host bounds one by one."""
        return default

    def normalize(self, args: Any) -> Any:
        """Validate beyond the pydantic model and fill defaults; raise `ValidationFailed`."""
        return args

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts | None:
        """What the host records as citable evidence of `result` (None: nothing citable).
        Only from the tool's own knowledge and declaration, never from the model."""
        return None

    def records_evidence(self, args: Any = None) -> bool:
        """Whether an answer of this tool (of this call, given its validated `args`) may carry
        the host's evidence record (its id, time and content reference): only when the tool
        says what to record (`evidence_facts`). A small context window reserves the record's
        room for these answers alone (`orchestrator.agent.turn_room`)."""
        return type(self).evidence_facts is not Tool.evidence_facts

    def looks_up(self, args: Any) -> bool:
        """Whether this call (of validated `args`) is a look-up (`look_up`): quick, changing
        and recording nothing, with a small answer (a tool's refusal of a call it cannot
        serve, too: a query of an undeclared source)."""
        return self.look_up

    def least_shown(self, args: Any) -> str | None:
        """The JSON text of the smallest payload this call's answer is shown with, however
        small the context window (a data source's: none of its rows, and why), or None when
        that is short (a preview's keys, a brief answer). The host runs no more calls of a
        turn than the window holds at this size (`orchestrator.agent.turn_room`)."""
        return None

    def verify(self, ctx: ToolContext, args: Any) -> bool | None:
        """Read-only read-back of a write: True = the intended state is in place, False = it is
        not, None = cannot tell (no verifier, sensitive, list append...)."""
        return None

    @abstractmethod
    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        """Do the work; raise only for the unexpected (the host maps exceptions to a status)."""

    def schema(self) -> dict[str, Any]:
        """The definition sent to a model: name, description, JSON schema of the arguments."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": _arguments_schema(self.arguments),
        }


@functools.cache
def _arguments_schema(model: type[ToolArguments]) -> dict[str, Any]:
    # Building a JSON schema costs about a millisecond; an argument model never changes.
    return model.model_json_schema()
