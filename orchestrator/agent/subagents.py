"""Read-only sub-agents (seed 000, 子代理连续工作): the `delegate` tool and its limits.

`delegate(question)` hands a question to a sub-agent: its own agent loop with the same model,
budget and compaction, and a read-only tool context, so the host refuses every write, plan,
report, action and `sensitive_read` on every call (not only by leaving them out of its list).
At most 4 sub-agents run at once and 8 are active (running or waiting for a slot) per round;
the answer, capped at 12,000 characters, is the tool result. A round's sub-agents end with the
round; the next round of the same session may delegate again; a closed session takes none.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from pydantic import Field

from orchestrator.agent.budget import ContextOverflow
from orchestrator.agent.catalogue import DISCOVERY
from orchestrator.agent.compaction import TranscriptHook
from orchestrator.agent.loop import LeaseLost, RoundEnd, TurnRecorder, TurnRunner, run_round
from orchestrator.agent.model import Model, ModelError
from orchestrator.agent.request import TRANSCRIPT, AgentContext
from orchestrator.agent.text_calls import answer_text
from orchestrator.tools.base import (
    CALL_ID,
    Tool,
    ToolArguments,
    ToolCall,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.results import fitting

__all__ = [
    "MAX_ACTIVE",
    "MAX_RESULT_CHARS",
    "MAX_RUNNING",
    "SUBAGENTS",
    "Delegate",
    "RoundDelegations",
    "SubAgentRegistry",
]

log = logging.getLogger(__name__)

MAX_RUNNING: Final = 4
MAX_ACTIVE: Final = 8
MAX_RESULT_CHARS: Final = 12_000
#: The key of `ToolContext.extras` holding the round's `RoundDelegations`.
SUBAGENTS: Final = "subagents"
_CALLS_LISTED: Final = 20
_SLOT_POLL_SECONDS: Final = 0.2
_CLOSED_KEPT: Final = 10_000

SUBAGENT_SYSTEM = (
    "You are a read-only sub-agent of an investigation. Answer the question you are given with "
    "read tools only: reading the task context, read operations of call_api, the output of an "
    "existing command, paged results. You cannot plan, report, propose actions or write; the "
    "host refuses it. End with a plain-text answer that states what you found, with the sources "
    "and the tool results it rests on, and what the main agent should check or do."
)

#: Builds the model of one sub-agent (a fresh conversation with the round's model).
ModelFactory = Callable[[], Model]


@dataclass(frozen=True)
class SubAgentRun:
    """How the sub-agents of a round run: their model, host, budget and turn limit."""

    model: ModelFactory
    host: TurnRunner
    max_turns: int
    stop: threading.Event
    context: AgentContext | None = None


class RoundDelegations:
    """The sub-agents of one round: the limits, and the end of the round."""

    def __init__(self, session_id: str, run: SubAgentRun) -> None:
        self.session_id = session_id
        self.run = run
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(MAX_RUNNING)
        self._active = 0
        self._running = 0
        self._numbers = itertools.count(1)
        self.closed_reason: str | None = None
        #: The most sub-agents seen running at once (for tests and logs).
        self.peak_running = 0
        self.started = 0

    def close(self, reason: str) -> None:
        """No new delegation after this (the round ended or the session closed)."""
        with self._lock:
            if self.closed_reason is None:
                self.closed_reason = reason

    def delegate(self, ctx: ToolContext, question: str) -> ToolResult:
        with self._lock:
            if self.closed_reason is not None:
                return ToolResult.failed(
                    f"no new delegation: {self.closed_reason}", code="delegation_closed"
                )
            if self._active >= MAX_ACTIVE:
                return ToolResult.failed(
                    f"{MAX_ACTIVE} sub-agents are already active in this round; wait for their "
                    "answers, then delegate again",
                    code="too_many_subagents",
                )
            self._active += 1
            number = next(self._numbers)
        try:
            while not self._slots.acquire(timeout=_SLOT_POLL_SECONDS):
                if self.run.stop.is_set():
                    raise LeaseLost("the round stopped while a sub-agent waited for a slot")
            try:
                with self._lock:
                    self._running += 1
                    self.started += 1
                    self.peak_running = max(self.peak_running, self._running)
                return self._run(ctx, question, number)
            finally:
                with self._lock:
                    self._running -= 1
                self._slots.release()
        finally:
            with self._lock:
                self._active -= 1

    def _run(self, ctx: ToolContext, question: str, number: int) -> ToolResult:
        try:
            model = self.run.model()
            model.check_tools(list(self.run.host.tools))
        except ModelError as exc:
            return ToolResult.failed(f"no sub-agent model: {exc}", code="subagent_unavailable")
        recorder = _Recorder(self.run.host)
        parent = ctx.extras.get(TRANSCRIPT)
        call_id = ctx.extras.get(CALL_ID)
        transcript: TranscriptHook | None = None
        if parent is not None and call_id is not None:
            transcript = parent.subagent(str(call_id))
        extras = {
            key: value
            for key, value in ctx.extras.items()
            if key not in (SUBAGENTS, DISCOVERY, CALL_ID, TRANSCRIPT)
        }
        sub_ctx = replace(ctx, readonly=True, round_id=f"{ctx.round_id}/sub{number}", extras=extras)
        try:
            end = run_round(
                model,
                recorder,
                sub_ctx,
                brief=question,
                max_turns=self.run.max_turns,
                stop=self.run.stop,
                context=self.run.context,
                transcript=transcript,
                recorder=transcript if isinstance(transcript, TurnRecorder) else None,
                system=SUBAGENT_SYSTEM,
            )
        except ModelError as exc:
            result = ToolResult.failed(f"the sub-agent's model failed: {exc}", code="model_error")
        except ContextOverflow as exc:
            result = ToolResult.failed(f"the sub-agent ran out of context: {exc}", code=exc.code)
        else:
            result = _answer(end, recorder.calls, ctx)
        # Its last results (written in the background) are in before the parent's answer is,
        # and a refused write (the generation was fenced) stops the round.
        flush = getattr(transcript, "flush", None)
        if callable(flush):
            flush()
        return result


def _answer(end: RoundEnd, calls: list[dict[str, Any]], ctx: ToolContext) -> ToolResult:
    text = end.final_text or ""
    if end.why == "turn_budget":
        text = text or "(the sub-agent ran out of turns before it answered)"
    elif not answer_text(text):
        # Said, not "": an empty answer read as one with nothing to report.
        text = "(the sub-agent's model returned an empty answer: no text and no tool call)"
    # At most 12,000 characters, and what the parent's context window can take (an answer is
    # not paged: shown whole, a long one failed the parent's round `context_overflow`).
    shown = fitting(ctx, text[:MAX_RESULT_CHARS])
    truncated = shown < len(text)
    if truncated:
        text = text[: max(1, shown - 1)] + "…"
    payload: dict[str, Any] = {
        "answer": text,
        "ended": end.why,
        "turns": end.turns,
        "truncated": truncated,
        "tool_calls": calls[:_CALLS_LISTED],
    }
    return ToolResult.ok(payload)


class _Recorder:
    """The host as the sub-agent sees it, keeping each call's name and status for the answer."""

    def __init__(self, host: TurnRunner) -> None:
        self.host = host
        self.calls: list[dict[str, Any]] = []

    @property
    def tools(self) -> dict[str, Tool]:
        return self.host.tools

    def schemas(self) -> list[dict[str, Any]]:
        return self.host.schemas()

    def run_turn(self, ctx: ToolContext, calls: list[ToolCall]) -> list[ToolResult]:
        results = self.host.run_turn(ctx, calls)
        for call, result in zip(calls, results, strict=True):
            entry = {"name": call.name, "status": result.status}
            if result.code is not None:
                entry["code"] = result.code
            self.calls.append(entry)
        return results


class SubAgentRegistry:
    """The delegations of every session in this process: one open round per session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[str, RoundDelegations] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()

    def open_round(self, session_id: str, run: SubAgentRun) -> RoundDelegations:
        """The delegations of a new round of `session_id` (already closed if the session is)."""
        delegations = RoundDelegations(session_id, run)
        with self._lock:
            if session_id in self._closed:
                delegations.close("the session is closed")
            else:
                previous = self._rounds.get(session_id)
                if previous is not None:
                    previous.close("the round ended")
                self._rounds[session_id] = delegations
        return delegations

    def end_round(self, session_id: str) -> None:
        with self._lock:
            delegations = self._rounds.pop(session_id, None)
        if delegations is not None:
            delegations.close("the round ended")

    def close_session(self, session_id: str) -> None:
        """The session takes no new delegation, ever (a process remembers the 10,000 most
        recently closed sessions; an execution's session is never reopened anyway)."""
        self.end_round(session_id)
        with self._lock:
            self._closed[session_id] = None
            self._closed.move_to_end(session_id)
            while len(self._closed) > _CLOSED_KEPT:
                self._closed.popitem(last=False)


class DelegateArgs(ToolArguments):
    question: str = Field(
        min_length=1,
        max_length=8000,
        description="what the sub-agent should find out, with the context it needs",
    )


class Delegate(Tool):
    """`delegate`: a read-only investigation by a sub-agent; its answer is the result."""

    name = "delegate"
    description = (
        "Hand a read-only question to a sub-agent that investigates with read tools only (the "
        "task context, read operations of call_api, an existing command's output) and answers "
        "in text (at most 12,000 characters). It cannot plan, report, propose actions or write. "
        "At most 4 run at once and 8 are active per round."
    )
    effect = "read"
    arguments = DelegateArgs
    pageable = False
    wants_call_id = True

    def read_uses(self) -> str | None:
        return None  # a sub-agent does not delegate further

    def time_limit(self, args: Any, default: float) -> float | None:
        # Bounded by its parts: every model call (LLM_TIMEOUT_SECONDS), every tool call (the
        # host's limit) and the turn budget. Giving it up would leave a sub-agent running.
        return None

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        if ctx.readonly:
            return ToolResult.failed("a sub-agent cannot delegate", code="readonly")
        delegations = ctx.extras.get(SUBAGENTS)
        if not isinstance(delegations, RoundDelegations):
            return ToolResult.failed(
                "delegation is not available in this conversation", code="delegation_closed"
            )
        return delegations.delegate(ctx, args.question)
