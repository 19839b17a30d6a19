"""Tool discovery (seed 000, 按需发现工具): the worker's tool catalogue, `search_tools`, and
which tool definitions each model call gets.

With `LLM_MAX_TOOLS` > 0 a call gets the resident tools (the task tools and the agent's own
capabilities), the *initial selection* (at most `LLM_MAX_TOOLS` selected for the task at the
start of the round, always offered, like the resident tools) and the *extra* tools: the
candidates `search_tools` found, most recent first. Every `call_api`
operation is its own catalogue entry, so a large business API does not flood the prompt: the
`call_api` definition a call gets lists only the enabled operations with their arguments. How well
a search matches an entry is `search_scores`' part.

The extra tools' definitions share min(4096 tokens, 10 % of the window); a search reports
candidates and the next call reports which were enabled and which were not, and why. The state
lives for one round. Discovery installs nothing and grants nothing: a read-only caller finds only
what it may use, and the host refuses the rest anyway.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import Field

from orchestrator.agent import search_scores
from orchestrator.agent.budget import (
    CANDIDATES_KEPT,
    SEARCH_LIMIT_DEFAULT,
    SEARCH_LIMIT_MAX,
    ContextBudget,
    TokenCounter,
)
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult
from orchestrator.tools.gateway import CallApi, CallApiArgs

__all__ = [
    "DISCOVERY",
    "INTERNAL_TOOLS",
    "RESIDENT_TOOLS",
    "Catalogue",
    "Discovery",
    "Entry",
    "Offer",
    "SearchTools",
    "external_tools",
]

#: The key of `ToolContext.extras` holding the round's `Discovery`.
DISCOVERY: Final = "discovery"

#: Always offered (when the caller may use them): the task tools and the agent's capabilities.
RESIDENT_TOOLS: Final = (
    "read_task_context",
    "publish_execution_plan",
    "propose_action",
    "save_report",
    "search_tools",
    "read_tool_result",
    "get_tool_execution",
    "delegate",
)

#: The agent's own session capabilities: never published through the internal bridge or any
#: external tool protocol (seed 000). Use `external_tools` for anything offered outside.
INTERNAL_TOOLS: Final = frozenset({"search_tools", "read_tool_result", "get_tool_execution"})

#: Extra search words of the tools that are not API operations.
_TOOL_TAGS: Final[Mapping[str, tuple[str, ...]]] = {
    "execute_command": ("command", "shell", "terminal", "process"),
    "describe_api_operation": ("api", "operation", "schema", "arguments"),
}

_COSTS_KEPT: Final = 1024


@dataclass(frozen=True)
class Entry:
    """One thing the agent can be offered: a tool, or one `call_api` operation."""

    name: str
    description: str
    tags: tuple[str, ...]
    tool: str
    effect: str
    read_ok: bool
    #: The JSON the entry adds to a request (its tool definition, or its operation block).
    schema: dict[str, Any]
    operation_id: str | None = None
    _names: frozenset[str] = field(default=frozenset(), repr=False)
    _words: frozenset[str] = field(default=frozenset(), repr=False)
    _tags: frozenset[str] = field(default=frozenset(), repr=False)
    _text: str = field(default="", repr=False)

    def public(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "tags": list(self.tags),
            "effect": self.effect,
        }
        if self.operation_id is not None:
            body["call"] = f"call_api(operation_id={self.operation_id!r})"
        return body


def _entry(
    name: str,
    description: str,
    tags: Sequence[str],
    *,
    tool: str,
    effect: str,
    read_ok: bool,
    schema: dict[str, Any],
    operation_id: str | None = None,
) -> Entry:
    tag_text = " ".join(tags).lower()
    return Entry(
        name=name,
        description=description,
        tags=tuple(tags),
        tool=tool,
        effect=effect,
        read_ok=read_ok,
        schema=schema,
        operation_id=operation_id,
        _names=frozenset(search_scores.stems(search_scores.split_name(name))),
        _words=frozenset(search_scores.stems(search_scores.WORD.findall(description.lower()))),
        _tags=frozenset(search_scores.stems(search_scores.WORD.findall(tag_text))),
        _text=f"{name} {description} {tag_text}".lower(),
    )


class Catalogue:
    """The tools of one host, as resident tools and searchable entries."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self.tools = dict(tools)
        self.resident = [name for name in tools if name in RESIDENT_TOOLS]
        self.entries: dict[str, Entry] = {}
        self.api: CallApi | None = None
        self._resident: dict[bool, list[dict[str, Any]]] = {}
        for name, tool in tools.items():
            if name in RESIDENT_TOOLS:
                continue
            if isinstance(tool, CallApi):
                self.api = tool
                for operation in tool.spec.operations.values():
                    key = operation.operation_id
                    if key in tools or key in self.entries:
                        key = f"call_api.{key}"
                    block = {
                        "operation_id": operation.operation_id,
                        "effect": operation.effect,
                        "summary": operation.summary,
                        "arguments": operation.arguments_schema(),
                    }
                    self.entries[key] = _entry(
                        key,
                        operation.summary or f"{operation.method} {operation.path}",
                        (*operation.tags, operation.method.lower(), "api"),
                        tool=name,
                        effect=operation.effect,
                        # A read marked `x-sensitive` is a sensitive original value: not
                        # for a read-only caller (seed 000), as `sensitive_read` is not.
                        read_ok=operation.effect == "read" and not operation.sensitive,
                        schema=block,
                        operation_id=operation.operation_id,
                    )
                continue
            self.entries[name] = _entry(
                name,
                tool.description,
                (*_TOOL_TAGS.get(name, ()), *getattr(tool, "tags", ())),
                tool=name,
                effect=tool.effect,
                read_ok=tool.read_uses() is not None,
                schema=tool.schema(),
            )

    # -- search ------------------------------------------------------------------------------

    def rank(self, query: str, *, readonly: bool = False) -> list[Entry]:
        """Every entry that matches `query`, best first; none when nothing matches."""
        scored = [
            (score, entry.name, entry)
            for entry in self.entries.values()
            if (entry.read_ok or not readonly) and (score := search_scores.score(entry, query)) > 0
        ]
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [entry for _, _, entry in scored]

    def search(
        self, query: str, limit: int = SEARCH_LIMIT_DEFAULT, *, readonly: bool = False
    ) -> list[Entry]:
        """At most `limit` (capped at 8) matching entries, best first."""
        return self.rank(query, readonly=readonly)[: max(1, min(limit, SEARCH_LIMIT_MAX))]

    # -- definitions -------------------------------------------------------------------------

    def resident_schemas(self, *, readonly: bool = False) -> list[dict[str, Any]]:
        """The resident tools' definitions, rendered once per catalogue like the entries'
        (a round's tools do not change): every call of a round gets the same objects, so the
        conversation measures them once (`Conversation._tools_tokens`)."""
        schemas = self._resident.get(readonly)
        if schemas is None:
            schemas = [
                self.tools[name].schema()
                for name in self.resident
                if not readonly or self.tools[name].read_uses() is not None
            ]
            schemas = self._resident.setdefault(readonly, schemas)
        return list(schemas)

    def extra_schemas(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The definitions the enabled entries `names` add: one per tool, and one `call_api`
        listing exactly the enabled operations."""
        schemas: list[dict[str, Any]] = []
        operations: list[dict[str, Any]] = []
        for name in names:
            entry = self.entries[name]
            if entry.operation_id is not None:
                operations.append(entry.schema)
            else:
                schemas.append(entry.schema)
        if operations and self.api is not None:
            schemas.append(self._call_api(operations))
        return schemas

    def all_schemas(self, *, readonly: bool = False) -> list[dict[str, Any]]:
        """Every definition a caller may use, as offered when discovery is off: the tools, and
        one `call_api` that lists its operations by id (`describe_api_operation` gives their
        arguments), as the gateway itself does."""
        allowed = [entry for entry in self.entries.values() if entry.read_ok or not readonly]
        schemas = [entry.schema for entry in allowed if entry.operation_id is None]
        operations = [entry for entry in allowed if entry.operation_id is not None]
        if operations and self.api is not None:
            parameters = CallApiArgs.model_json_schema()
            parameters["properties"]["operation_id"] = {
                "type": "string",
                "enum": [entry.operation_id for entry in operations],
            }
            listed = "; ".join(
                f"{entry.operation_id} ({entry.effect}): {entry.description}"
                for entry in operations
            )
            schemas.append(
                {
                    "name": self.api.name,
                    "description": (
                        f"Call an operation of {self.api.spec.title}. Use describe_api_operation "
                        f"to see an operation's arguments. Operations: {listed}"
                    ),
                    "parameters": parameters,
                }
            )
        return [*self.resident_schemas(readonly=readonly), *schemas]

    def _call_api(self, operations: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.api is not None
        ids = [block["operation_id"] for block in operations]
        parameters = CallApiArgs.model_json_schema()
        parameters["properties"]["operation_id"] = {"type": "string", "enum": ids}
        listed = "\n".join(json.dumps(block, ensure_ascii=False) for block in operations)
        return {
            "name": self.api.name,
            "description": (
                f"Call an operation of {self.api.spec.title}. The operations offered now, with "
                f"their arguments (JSON Schema; the JSON request body as 'body'):\n{listed}"
            ),
            "parameters": parameters,
        }


@dataclass(frozen=True)
class Offer:
    """What one model call got: the enabled entries (the initial selection first), and the
    refused candidates with why. `extra_tokens` counts the discovered candidates only."""

    enabled: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    extra_tokens: int
    budget_tokens: int
    initial: tuple[str, ...] = ()

    @property
    def discovered(self) -> tuple[str, ...]:
        """The enabled entries that came from `search_tools` (not the initial selection)."""
        return self.enabled[len(self.initial) :]

    def notice(self) -> str:
        text = "Tool discovery: "
        text += (
            "enabled for this call: " + ", ".join(self.enabled)
            if self.enabled
            else "no extra tool is enabled for this call"
        )
        # The budget is the discovered tools' alone: the initial selection is always offered.
        discovered = ", ".join(self.discovered) or "none"
        text += (
            f" (discovered: {discovered}, using {self.extra_tokens} of {self.budget_tokens} "
            "extra-tool tokens; the initial selection is always offered)."
        )
        if self.refused:
            text += " Not enabled: " + "; ".join(f"{name} ({why})" for name, why in self.refused)
            text += "."
        return text


class Discovery:
    """The discovery state of one round (or one sub-agent): initial selection and candidates."""

    def __init__(
        self,
        catalogue: Catalogue,
        budget: ContextBudget,
        counter: TokenCounter,
        *,
        brief: str,
        readonly: bool = False,
    ) -> None:
        self.catalogue = catalogue
        self.budget = budget
        self.counter = counter
        self.readonly = readonly
        self.initial = [
            entry.name for entry in catalogue.rank(brief, readonly=readonly)[: budget.max_tools]
        ]
        self.candidates: OrderedDict[str, None] = OrderedDict()
        self.last: Offer | None = None
        self._searched = False
        self._lock = threading.Lock()
        self._costs: dict[tuple[str, ...], int] = {}

    def discover(self, query: str, limit: int = SEARCH_LIMIT_DEFAULT) -> list[Entry]:
        """Search and keep what was found as candidates (the 16 most recent; a new discovery
        refreshes a candidate's priority). No match adds nothing."""
        found = self.catalogue.search(query, limit, readonly=self.readonly)
        with self._lock:
            for entry in reversed(found):  # the best match ends up the most recent
                self.candidates[entry.name] = None
                self.candidates.move_to_end(entry.name)
            while len(self.candidates) > CANDIDATES_KEPT:
                self.candidates.popitem(last=False)
            if found:
                self._searched = True
        return found

    def offer(self, *, room: int | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The definitions of the next call and, after a search, the notice reporting what was
        enabled. The initial selection is always offered, like the resident tools (seed 000:
        初选、常驻…工具保持可用); the discovered candidates share the extra-tool budget, most
        recent first. `room` lowers that budget (the request's 15 % margin)."""
        with self._lock:
            initial = list(self.initial)
            order = [name for name in reversed(self.candidates) if name not in initial]
            searched, self._searched = self._searched, False
        budget = self.budget.extra_tools_tokens
        limit = budget if room is None else max(0, min(budget, room))
        base = self._cost(initial)
        enabled: list[str] = []
        refused: list[tuple[str, str]] = []
        used = 0
        for name in order:
            cost = self._cost([*initial, *enabled, name]) - base
            if cost <= limit:
                enabled.append(name)
                used = cost
            elif room is not None and cost <= budget:
                refused.append((name, "the request would not keep its 15 % margin of the window"))
            else:
                refused.append(
                    (
                        name,
                        f"its definition needs {cost - used} tokens and {used} of the "
                        f"{budget}-token extra-tool budget are in use",
                    )
                )
        offer = Offer((*initial, *enabled), tuple(refused), used, budget, tuple(initial))
        self.last = offer
        schemas = [
            *self.catalogue.resident_schemas(readonly=self.readonly),
            *self.catalogue.extra_schemas(offer.enabled),
        ]
        return schemas, offer.notice() if searched or room is not None else None

    def _cost(self, names: Sequence[str]) -> int:
        """The tokens of the extra definitions `names` add, rendered exactly as they are sent
        (remembered: the same candidates are offered call after call)."""
        key = tuple(names)
        raw = self._costs.get(key)
        if raw is None:
            schemas = self.catalogue.extra_schemas(names)
            raw = sum(self.counter.schema(schema) for schema in schemas)
            if len(self._costs) >= _COSTS_KEPT:
                self._costs.clear()
            self._costs[key] = raw
        return self.counter.scaled(raw)


class SearchToolsArgs(ToolArguments):
    search: str = Field(min_length=1, max_length=200, description="a tool name, words or tags")
    limit: int = Field(default=SEARCH_LIMIT_DEFAULT, ge=1, description="at most 8 are returned")


class SearchTools(Tool):
    """`search_tools`: find more tools in this worker's catalogue for the next model call."""

    name = "search_tools"
    description = (
        "Search this worker's tool catalogue (every business API operation is its own entry) by "
        "exact name, description words or tags; Chinese capability words such as 整理, 工单, "
        "采样 and 水质 work too. Returns at most `limit` candidates (default 5, at most 8); "
        "the next model call enables them as far as the extra-tool budget allows and says "
        "which were not enabled and why. No match returns nothing. Finding a tool grants no "
        "permission."
    )
    effect = "read"
    arguments = SearchToolsArgs
    pageable = False

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        discovery = ctx.extras.get(DISCOVERY)
        if not isinstance(discovery, Discovery):
            return ToolResult.failed(
                "tool discovery is off (LLM_MAX_TOOLS=0): every tool is already offered",
                code="discovery_off",
            )
        found = discovery.discover(args.search, args.limit)
        payload: dict[str, Any] = {
            "candidates": [entry.public() for entry in found],
            "limit": min(args.limit, SEARCH_LIMIT_MAX),
        }
        if found:
            payload["note"] = (
                "candidates are enabled from the next model call as far as the extra-tool "
                "budget allows; that call says which were and which were not"
            )
        else:
            payload["note"] = "no tool matches; nothing was added"
        return ToolResult.ok(payload)


def external_tools(tools: Sequence[Tool]) -> list[Tool]:
    """The tools that may be published outside the agent (the internal bridge, any external
    tool protocol): never the agent's internal capabilities."""
    return [tool for tool in tools if tool.name not in INTERNAL_TOOLS]
