"""The agent loop of one round: ask the model, run its tool calls, feed the results back."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from orchestrator.agent.compaction import TranscriptHook
from orchestrator.agent.model import Model, ModelError, ModelTurn
from orchestrator.agent.repeats import RepeatedRefusals
from orchestrator.agent.request import AgentContext, RequestBuilder
from orchestrator.agent.text import clean_text
from orchestrator.agent.wire import assistant_message
from orchestrator.tools.base import Tool, ToolCall, ToolContext, ToolResult

log = logging.getLogger(__name__)

__all__ = [
    "RECEIVED",
    "LeaseLost",
    "RoundEnd",
    "StopSignal",
    "TurnRecorder",
    "TurnRunner",
    "run_calls",
    "run_round",
    "stop_reason",
]

#: The attribute of an exception out of `TurnRunner.run_turn` holding the calls of the turn that
#: did return, with their results (a cancel or a fenced write in one call ends the whole turn).
RECEIVED = "received_results"


class LeaseLost(Exception):
    """The execution can no longer be sure it holds its lease; it must stop writing at once."""


class StopSignal(threading.Event):
    """The round's stop event, and why it was set: the line that says the round stopped
    names it (a cancel is not a lease that ran out)."""

    def __init__(self) -> None:
        super().__init__()
        self.why: str | None = None

    def stop(self, why: str) -> None:
        """Set the event, keeping the first reason."""
        if self.why is None:
            self.why = why
        self.set()


def stop_reason(stop: threading.Event | None, default: str = "the lease may have run out") -> str:
    """Why `stop` was set, for a line or an error: the signal's reason when it has one."""
    why = getattr(stop, "why", None)
    return why if isinstance(why, str) and why else default


class TurnRunner(Protocol):
    @property
    def tools(self) -> dict[str, Tool]: ...

    def schemas(self) -> list[dict[str, Any]]: ...

    def run_turn(self, ctx: ToolContext, calls: list[ToolCall]) -> list[ToolResult]: ...


@runtime_checkable
class TurnRecorder(Protocol):
    """Keeps what came back from the model (the durable transcript, token usage)."""

    def model_turn(self, turn_number: int, message: dict[str, Any], turn: ModelTurn) -> None:
        """Called after each model turn, before any of its tool calls runs."""

    def tool_results(
        self, turn_number: int, calls: list[ToolCall], results: list[ToolResult]
    ) -> None:
        """Called with the envelopes the model is about to be shown."""


@dataclass(frozen=True)
class RoundEnd:
    why: Literal["final_answer", "turn_budget"]
    turns: int
    final_text: str | None


def run_round(
    model: Model,
    host: TurnRunner,
    ctx: ToolContext,
    *,
    brief: str,
    max_turns: int,
    stop: threading.Event,
    recorder: TurnRecorder | None = None,
    context: AgentContext | None = None,
    transcript: TranscriptHook | None = None,
    system: str | None = None,
    topic: str | None = None,
) -> RoundEnd:
    """Run turns until the model answers without tool calls or the turn budget runs out.

    Raises `ModelError` when the server cut a reply without tool calls short (its output limit),
    or returned a call it did not parse as the reply's text or thinking, after the turn was
    recorded, and when the model made the same refused calls `SAME_FAILURE_LIMIT` turns in a
    row (`agent.repeats`), after their results were recorded; `LeaseLost` as soon as `stop` is
    set; `StaleGeneration` from a refused write propagates from the host unchanged. Either way
    nothing more is written by this round.
    With a `context`, every request is measured and compacted within its budget
    (`ContextOverflow` when what must stay does not fit) and tools are discovered
    (`LLM_MAX_TOOLS`) by `topic` (the brief when None); see `orchestrator.agent.request`.
    """
    requests = RequestBuilder(
        model,
        host.tools,
        host.schemas(),
        ctx,
        system=system or _SYSTEM,
        brief=brief,
        topic=topic,
        stop=stop,
        context=context,
        transcript=transcript,
    )
    ctx = requests.ctx
    refusals = RepeatedRefusals()
    for turn_number in range(1, max_turns + 1):
        _check(stop)
        messages, tools = requests.build()
        turn = model.next_turn(messages, tools, stop)
        requests.observe_usage(getattr(turn, "usage", None))
        _check(stop)
        message = assistant_message(turn)
        requests.add_assistant(message)
        if recorder is not None:
            recorder.model_turn(turn_number, message, turn)
        if turn.final and turn.unparsed is not None:
            # A call the server did not parse (`reply_parts.as_calls`): never run, and every
            # reply of this server would be the same.
            raise ModelError(turn.unparsed)
        if turn.final and turn.cut_off is not None:
            # Stopped mid-answer, not done: the round must not be judged on half a sentence.
            raise ModelError(f"{turn.cut_off} before it called a tool or finished its answer")
        if turn.final:
            return RoundEnd("final_answer", turn_number, turn.content)
        try:
            results = run_calls(host, ctx, turn)
        except BaseException as error:
            _record_received(recorder, turn_number, error)
            raise
        if recorder is not None:
            recorder.tool_results(turn_number, list(turn.tool_calls), results)
        repeated = refusals.observe(turn.tool_calls, results)
        if repeated is not None:
            # Recorded first: the transcript shows the calls and what the model was told.
            raise ModelError(repeated)
        answers = [
            {
                "role": "tool",
                "tool_call_id": call.id,
                # A tool may return what is not UTF-8 (a lone surrogate from a JSON API).
                "content": clean_text(result.message_text),
            }
            for call, result in zip(turn.tool_calls, results, strict=True)
        ]
        requests.add_results(turn.tool_calls, results, answers)
    return RoundEnd("turn_budget", max_turns, None)


def run_calls(host: TurnRunner, ctx: ToolContext, turn: ModelTurn) -> list[ToolResult]:
    """The host runs the readable calls; unreadable arguments are answered `failed` in place
    (a round's and a collaboration's turns alike)."""
    if not turn.malformed:
        return host.run_turn(ctx, list(turn.tool_calls))
    why = dict(turn.malformed)
    runnable = [call for call in turn.tool_calls if call.id not in why]
    ran = iter(host.run_turn(ctx, runnable) if runnable else [])
    return [
        ToolResult.failed(f"{why[call.id]}; nothing was run", code="invalid_arguments")
        if call.id in why
        else next(ran)
        for call in turn.tool_calls
    ]


def _record_received(recorder: TurnRecorder | None, turn_number: int, error: BaseException) -> None:
    """The results of the calls that returned before the turn ended by `error`: the recovery
    snapshot shows them received (with their receipts), not unknown."""
    received = getattr(error, RECEIVED, None)
    if recorder is None or not isinstance(received, list) or not received:
        return
    try:
        recorder.tool_results(
            turn_number, [call for call, _ in received], [result for _, result in received]
        )
    except Exception:  # the turn's own error is what propagates
        log.info("the results received before the turn ended were not recorded", exc_info=True)


def _check(stop: threading.Event) -> None:
    if stop.is_set():
        raise LeaseLost(f"{stop_reason(stop)}; this generation stops writing")


_SYSTEM = (
    "You investigate a condition task. Its context is in the brief, as data; "
    "read_task_context adds the previous generation, the task's actions and their decisions, "
    "and what a stopped generation left to verify. Publish an execution plan "
    "with publish_execution_plan and keep its node statuses true, query only the data sources "
    "you are given, propose work orders or commands only as actions that a human approves, and "
    "end the round with save_report. A completed node needs evidence; a truncated query result "
    "cannot support a claim about its whole range. A failed node keeps the task from completing "
    "until a retry of it is completed: a new node of the same actor with an edge from the "
    "failed node (a person closes a human one); a step that cannot be retried ends the task "
    "with save_report outcome failed."
)
