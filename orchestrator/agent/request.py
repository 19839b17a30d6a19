"""What each model call of a round is sent: messages within the budget and the tool definitions.

The agent loop hands every turn and result here and asks for the next request. This module puts
the conversation (`compaction.Conversation`), tool discovery (`catalogue.Discovery`), the room
of each turn's results (`result_room.ResultRoom`) and the read-only filter together; it records
nothing itself (the transcript hook does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.agent.budget import ContextBudget, ContextOverflow, TokenCounter, prompt_tokens_of
from orchestrator.agent.catalogue import DISCOVERY, Catalogue, Discovery
from orchestrator.agent.compaction import Conversation, SummaryAnswer, TranscriptHook
from orchestrator.agent.model import Model, ModelTurn
from orchestrator.agent.result_room import ResultRoom
from orchestrator.agent.sensitive import (
    is_sensitive,
    kept_arguments,
    redact_values,
)
from orchestrator.agent.turn_room import (
    TURN_ANSWERED,
    TURN_FIT,
)
from orchestrator.logs import Secret
from orchestrator.tools.base import Tool, ToolCall, ToolContext, ToolResult
from orchestrator.tools.results import (
    PREVIEW_FIT,
    RESULT_FIT,
    WHOLE_FIT,
)

__all__ = ["TRANSCRIPT", "AgentContext", "RequestBuilder"]

log = logging.getLogger(__name__)

#: How much a request must have grown (uncalibrated tokens) before a prompt count that did not
#: grow with it is read as the server cutting the prompt (`_cut_by_server`).
CUT_GROWTH_TOKENS = 256

#: The key of `ToolContext.extras` holding the round's transcript hook (for sub-agents).
TRANSCRIPT = "transcript"


@dataclass(frozen=True)
class AgentContext:
    """The budget every conversation of a worker runs within, and its token counter."""

    budget: ContextBudget
    counter: TokenCounter
    #: The configured secrets (`orchestrator.logs.secrets_of`), masked in an unknown tool's
    #: arguments where a summary request shows them (`sensitive.hide_unknown_arguments`).
    secrets: tuple[Secret, ...] = ()


class RequestBuilder:
    """The requests of one round (or one sub-agent's loop)."""

    def __init__(
        self,
        model: Model,
        tools: Mapping[str, Tool] | None,
        fallback_schemas: Sequence[dict[str, Any]],
        ctx: ToolContext,
        *,
        system: str,
        brief: str,
        stop: threading.Event,
        context: AgentContext | None = None,
        transcript: TranscriptHook | None = None,
        topic: str | None = None,
    ) -> None:
        """`topic` is what the initial tools are chosen by (the brief when None)."""
        self.context = context
        self.tools = tools
        self.readonly = ctx.readonly
        self.conversation = Conversation(
            system=system,
            brief=brief,
            budget=context.budget if context else None,
            counter=context.counter if context else None,
            summarize=lambda messages: _summary(model.summary_turn(messages, stop)),
            transcript=transcript,
        )
        discovering = context is not None and context.budget.max_tools > 0
        # Built only when needed: a large API's schemas cost time to render.
        needed = tools is not None and (discovering or ctx.readonly)
        self.catalogue = Catalogue(tools) if needed and tools is not None else None
        self.discovery: Discovery | None = None
        #: The last request's uncalibrated size and the prompt tokens the server reported for it,
        #: and whether this round has warned of a server cutting its prompts.
        self._reported: tuple[int, int] | None = None
        self._warned_cut = False
        extras = dict(ctx.extras)
        if transcript is not None:
            extras[TRANSCRIPT] = transcript
        #: The room of the running turn's results (`result_room`), when the window is known.
        self.room = ResultRoom(context, tools, self.conversation) if context else None
        if self.room is not None:
            # A large result's preview and pages fit the window (`ContextBudget.result_tokens`).
            extras[RESULT_FIT] = self.room.result_fit
            extras[PREVIEW_FIT] = self.room.preview_fit
            extras[WHOLE_FIT] = self.room.whole_fit
            extras[TURN_FIT] = self.room.turn_fit
            extras[TURN_ANSWERED] = self.room.answered
        if self.catalogue is not None and context is not None and discovering:
            self.discovery = Discovery(
                self.catalogue,
                context.budget,
                context.counter,
                brief=brief if topic is None else topic,
                readonly=ctx.readonly,
            )
            extras[DISCOVERY] = self.discovery
        self.ctx = replace(ctx, extras=extras)
        if self.catalogue is not None and ctx.readonly:
            self._schemas = self.catalogue.all_schemas(readonly=True)
        else:
            # Discovery off: every tool, as the host lists them.
            self._schemas = list(fallback_schemas)

    def build(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The messages and tool definitions of the next call (`ContextOverflow` when what
        must be kept does not fit the window)."""
        if self.discovery is None:
            return self.conversation.prepare(self._schemas), self._schemas
        tools, notice = self.discovery.offer()
        try:
            return self.conversation.prepare(tools, notice), tools
        except ContextOverflow:
            if not self.discovery.last or not self.discovery.last.discovered:
                raise
        # Without the discovered tools the kept parts may fit: report it rather than fail. The
        # initial selection stays, like the resident tools; if they alone do not fit, the round
        # fails with `context_overflow` instead of losing them silently.
        tools, notice = self.discovery.offer(room=0)
        return self.conversation.prepare(tools, notice), tools

    def add_assistant(self, message: dict[str, Any]) -> None:
        if self.room is not None:
            self.room.start(message)
        self.conversation.add_assistant(message)

    def add_results(
        self,
        calls: Sequence[ToolCall],
        results: Sequence[ToolResult],
        messages: Sequence[dict[str, Any]],
    ) -> None:
        tools = self.tools or {}
        sensitive = [
            call.id for call in calls if is_sensitive(tools.get(call.name), call.arguments)
        ]
        # A summary request shows each call's arguments as the transcript keeps them.
        kept: dict[str, Any] = {}
        for call in calls:
            tool = tools.get(call.name)
            if call.id in sensitive:
                kept[call.id] = redact_values(call.arguments)
                continue
            # What may be secret hidden, as the transcript keeps it (`sensitive.kept_arguments`).
            shown = kept_arguments(
                tool, call.arguments, self.context.secrets if self.context else ()
            )
            if shown != call.arguments:
                kept[call.id] = shown
        self.conversation.add_tool_results(
            messages,
            [(call.name, result) for call, result in zip(calls, results, strict=True)],
            sensitive=sensitive,
            kept_arguments=kept,
        )

    def observe_usage(self, usage: Any) -> None:
        """Calibrate the token counter with the prompt size the server reported, if any.

        A server that cuts a prompt past its window without an error (Ollama's OpenAI API does,
        at its context length, whatever LLM_CONTEXT_WINDOW says) reports the cut prompt's size:
        the request grew and the count did not. The model then did not see the start of the
        request (the system prompt, the brief) and nothing else says so: the worker warns once
        a round, naming the settings, and the count is not calibrated by, since it is not the
        size of this request (calibrating by it would make every later request look half its
        size, in every round of the process)."""
        reported = prompt_tokens_of(usage)
        if reported is None or self.context is None:
            return
        raw = self.conversation.last_raw
        before, self._reported = self._reported, (raw, reported)
        if before is not None and _cut_by_server(before, (raw, reported)):
            if not self._warned_cut:
                self._warned_cut = True
                counter, window = self.context.counter, self.context.budget.window
                log.warning(
                    "the model server counted %d prompt tokens for a request of about %d (and "
                    "%d for the one before, of about %d): it seems to cut prompts past its own "
                    "window without an error, so the model does not see all of the request; "
                    "make the server's window LLM_CONTEXT_WINDOW=%d (Ollama: "
                    "OLLAMA_CONTEXT_LENGTH or the model's num_ctx), or set LLM_CONTEXT_WINDOW "
                    "to the server's window",
                    reported,
                    counter.scaled(raw),
                    before[1],
                    counter.scaled(before[0]),
                    window,
                )
            return
        self.context.counter.calibrate(raw, reported)


def _cut_by_server(before: tuple[int, int], now: tuple[int, int]) -> bool:
    """Whether the prompt count `now` (uncalibrated size, reported tokens) is that of a prompt
    the server cut: the request grew by `CUT_GROWTH_TOKENS` or more since `before`, and the
    count is under half of what the ratio of `before` makes of its size. A tokenizer's ratio
    to the local count moves with the text (JSON, prose, CJK), not by half in one turn;
    Ollama cuts a prompt past its window to half of the window."""
    grown = now[0] - before[0]
    if before[0] <= 0 or before[1] <= 0 or now[1] <= 0 or grown < CUT_GROWTH_TOKENS:
        return False
    return now[1] * before[0] * 2 < before[1] * now[0]


def _summary(turn: ModelTurn | None) -> SummaryAnswer | None:
    """A summary call's answer with its usage (the transcript records both)."""
    if turn is None:
        return None
    usage = turn.usage
    return SummaryAnswer(
        None if turn.tool_calls else turn.content,
        usage.prompt_tokens if usage else None,
        usage.completion_tokens if usage else None,
    )
