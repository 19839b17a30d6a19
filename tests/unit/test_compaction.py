"""Compaction keeps the plan and the latest tool transaction, never splits a call from its
results, falls back to a digest, and fails with context_overflow instead of dropping."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.agent.budget import ContextBudget, ContextOverflow, TokenCounter
from orchestrator.agent.compaction import (
    PLAN_PREFIX,
    SUMMARY_PREFIX,
    Compaction,
    Conversation,
    TranscriptHook,
)
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.model import Model, ModelTurn
from orchestrator.agent.request import AgentContext
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult

PLAN = {
    "revision": 3,
    "nodes": [{"id": "a", "status": "completed"}, {"id": "b", "status": "running"}],
}
TOOLS = [{"name": "read_task_context", "description": "read", "parameters": {"type": "object"}}]


def assert_strict(messages: Sequence[dict[str, Any]]) -> None:
    """What a strict server accepts: every assistant tool call is answered by exactly one tool
    message, in order, before any other message; no tool message anywhere else."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"tool message out of place at {index}"
        index += 1
        if message["role"] == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                assert index < len(messages), "unanswered tool call"
                answer = messages[index]
                assert answer["role"] == "tool"
                assert answer["tool_call_id"] == call["id"]
                index += 1


def transaction(
    convo: Conversation, number: int, *, calls: int = 2, size: int = 40, name: str = "call_api"
) -> None:
    ids = [f"t{number}c{k}" for k in range(calls)]
    convo.add_assistant(
        {
            "role": "assistant",
            "content": f"turn {number}",
            "tool_calls": [
                {"id": i, "name": name, "arguments": {"operation_id": "getSetting"}} for i in ids
            ],
        }
    )
    results = [
        ToolResult(
            status="succeeded" if k else "unknown",
            payload={"rows": ["reading " * size]},
            invocation_id=f"inv-{number}-{k}",
        )
        for k in range(calls)
    ]
    convo.add_tool_results(
        [
            {"role": "tool", "tool_call_id": i, "content": json.dumps(r.to_message())}
            for i, r in zip(ids, results, strict=True)
        ],
        [(name, r) for r in results],
    )


class Hook:
    def __init__(self) -> None:
        self.records: list[Compaction] = []

    def compacted(self, compaction: Compaction) -> None:
        self.records.append(compaction)

    def subagent(self, parent_call_id: str) -> TranscriptHook:
        return self


def conversation(window: int = 2000, **kwargs: Any) -> Conversation:
    return Conversation(
        system="You investigate.",
        brief="Condition task t1 (pressure): low pressure",
        budget=ContextBudget(window),
        counter=TokenCounter(),
        **kwargs,
    )


def with_plan(convo: Conversation) -> None:
    convo.add_assistant(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "p1", "name": "publish_execution_plan", "arguments": {}}],
        }
    )
    convo.add_tool_results(
        [{"role": "tool", "tool_call_id": "p1", "content": '{"status": "succeeded"}'}],
        [("publish_execution_plan", ToolResult.ok(PLAN))],
    )


def test_nothing_happens_within_the_limit() -> None:
    convo = conversation(window=100_000)
    transaction(convo, 1)
    messages = convo.prepare(TOOLS)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert convo.compactions == []


def test_compaction_keeps_the_plan_and_the_latest_transaction_whole() -> None:
    hook = Hook()
    convo = conversation(summarize=lambda _messages: "the model's summary", transcript=hook)
    with_plan(convo)
    for number in range(1, 12):
        transaction(convo, number)
        messages = convo.prepare(TOOLS)
        assert_strict(messages)
        assert convo.counter is not None
        assert convo.budget is not None
        assert convo.counter.raw(messages, TOOLS) <= convo.budget.request_limit
    assert convo.compactions, "the history outgrew the window and must have been compacted"
    # The plan's publish call was compacted long ago; the plan is still its own message.
    assert messages[2] == {"role": "user", "content": PLAN_PREFIX + json.dumps(PLAN)}
    assert messages[3]["content"] == SUMMARY_PREFIX + "the model's summary"
    last_ids = [m.get("tool_call_id") for m in messages[-2:]]
    assert last_ids == ["t11c0", "t11c1"]
    assert messages[-3]["content"] == "turn 11"
    assert hook.records == convo.compactions
    first = hook.records[0]
    assert (first.source, first.tokens_after < first.tokens_before) == ("model", True)


def test_a_failed_summary_call_falls_back_to_a_digest_of_receipts_and_plan() -> None:
    def broken(_messages: list[dict[str, Any]]) -> str:
        raise RuntimeError("the model is down")

    convo = conversation(summarize=broken)
    with_plan(convo)
    for number in range(1, 8):
        transaction(convo, number)
        convo.prepare(TOOLS)
    record = convo.compactions[0]
    assert record.source == "digest"
    assert "call_api(getSetting) [t1c0] → unknown invocation_id=inv-1-0" in record.summary
    assert "[t1c1] → succeeded invocation_id=inv-1-1" in record.summary
    assert "Plan nodes: a=completed, b=running" in record.summary
    assert "reading" not in record.summary  # results' bodies are not in the digest


def test_a_digest_over_its_budget_keeps_the_newest_receipts_and_one_header() -> None:
    """The scripted model, or a summary call that keeps failing, digests every compaction into
    the last digest. Cut at its budget from the end, it kept the oldest receipts and lost the
    newest (unknown writes among them), under one "Before that:" header per compaction."""
    convo = conversation(summarize=None)
    with_plan(convo)
    for number in range(1, 61):
        transaction(convo, number)
        convo.prepare(TOOLS)
    assert len(convo.compactions) > 5
    summary = convo.compactions[-1].summary
    assert convo.budget is not None
    assert convo.counter is not None
    assert convo.counter.text(summary) <= convo.budget.summary_tokens
    assert summary.count("Earlier turns were compacted") == 1
    assert "Before that" not in summary
    # The newest compacted transaction is the one before the first still in the history.
    kept = next(m for m in convo.history if m.get("tool_calls"))
    newest = int(kept["tool_calls"][0]["id"].removeprefix("t").split("c")[0]) - 1
    assert f"[t{newest}c0] → unknown invocation_id=inv-{newest}-0" in summary
    assert "[t1c1] → succeeded" not in summary
    assert "earlier entries left out to fit" in summary
    assert summary.endswith("Plan nodes: a=completed, b=running")


def test_the_summary_request_itself_fits_the_window() -> None:
    seen: list[list[dict[str, Any]]] = []

    def summarize(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return "ok"

    convo = conversation(summarize=summarize)
    for number in range(1, 10):
        transaction(convo, number, size=80)
        convo.prepare(TOOLS)
    assert seen
    counter = TokenCounter()
    for request in seen:
        assert counter.raw(request, []) <= ContextBudget(2000).request_limit


def test_a_plan_larger_than_the_window_is_a_context_overflow() -> None:
    convo = conversation(window=1024)
    convo.plan = {
        "nodes": [{"id": f"n{k}", "description": "check the valve " * 20} for k in range(20)]
    }
    transaction(convo, 1)
    with pytest.raises(ContextOverflow, match="1024 tokens is too small"):
        convo.prepare(TOOLS)


def test_a_latest_transaction_larger_than_the_window_is_a_context_overflow() -> None:
    convo = conversation(window=2000)
    transaction(convo, 1)
    transaction(convo, 2, size=2000)
    with pytest.raises(ContextOverflow, match="latest tool transaction"):
        convo.prepare(TOOLS)
    # Nothing was dropped: both transactions are still there.
    assert len(convo.history) == 6


def test_calibration_compacts_earlier() -> None:
    plain, calibrated = conversation(), conversation()
    assert calibrated.counter is not None
    calibrated.counter.calibrate(1000, 2000)  # the server counts twice as many tokens
    for convo in (plain, calibrated):
        for number in range(1, 5):
            transaction(convo, number)
            convo.prepare(TOOLS)
    assert plain.compactions == []
    assert calibrated.compactions


def test_without_a_budget_the_conversation_is_sent_as_is() -> None:
    convo = Conversation(system="s", brief="b")
    for number in range(1, 30):
        transaction(convo, number)
    assert len(convo.prepare(TOOLS)) == 2 + 29 * 3


class Investigator(Model):
    """Asks for a large read `turns` times, then answers; summarises when asked (no tools)."""

    def __init__(self, turns: int, ratio: float = 1.0) -> None:
        self.turns = turns
        self.ratio = ratio
        self.requests: list[list[dict[str, Any]]] = []
        self.summary_tools: list[Sequence[dict[str, Any]]] = []

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        if messages[0]["content"].startswith("Summarise"):
            self.summary_tools.append(tools)
            return ModelTurn(content="the model's own summary", tool_calls=())
        self.requests.append(list(messages))
        number = len(self.requests)
        usage = {"prompt_tokens": int(TokenCounter().raw(messages, tools) * self.ratio)}
        if number > self.turns:
            return UsageTurn(content="done", tool_calls=(), usage=usage)
        call = ToolCall(f"c{number}", "read_things", {})
        return UsageTurn(content=None, tool_calls=(call,), usage=usage)


@dataclass(frozen=True)
class UsageTurn(ModelTurn):
    usage: Any = None


class _NoArgs(ToolArguments):
    pass


class ReadThings(Tool):
    name = "read_things"
    description = "read many things"
    arguments = _NoArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"rows": ["reading " * 150]})


def test_a_round_compacts_with_a_summary_call_and_calibrates_from_usage() -> None:
    model = Investigator(turns=12, ratio=1.1)
    context = AgentContext(ContextBudget(3000, 200), TokenCounter())
    end = run_round(
        model,
        ToolHost([ReadThings()], ledger=None),
        ToolContext(owner="o", session_id="s", round_id="r"),
        brief="find the leak",
        max_turns=20,
        stop=threading.Event(),
        context=context,
    )
    assert (end.why, end.final_text) == ("final_answer", "done")
    assert model.summary_tools
    assert all(tools == [] for tools in model.summary_tools)
    for messages in model.requests:
        assert_strict(messages)
    assert any(
        m["content"] == SUMMARY_PREFIX + "the model's own summary"
        for m in model.requests[-1]
        if m["role"] == "user"
    )
    assert context.counter.ratio == pytest.approx(1.1, abs=0.01)


def test_last_raw_is_the_exact_size_of_each_request_as_sent() -> None:
    """Calibration's `last_raw` is `counter.raw` of what `prepare` returned: with a plan, a
    notice, compaction and a new tool set, and not moved by what is added after the call."""
    convo = conversation(window=2000)
    counter = convo.counter
    assert counter is not None
    with_plan(convo)
    tools: list[dict[str, Any]] = TOOLS
    for number in range(1, 9):
        transaction(convo, number)
        if number == 5:
            tools = [*TOOLS, {"name": "search_tools", "description": "find", "parameters": {}}]
        notice = "Tool discovery: enabled search_tools" if number % 3 == 0 else None
        messages = convo.prepare(tools, notice)
        assert convo.last_raw == counter.raw(messages, tools)
        convo.add_assistant({"role": "assistant", "content": "noted " * number})
        assert convo.last_raw == counter.raw(messages, tools)  # the request that was sent
    assert convo.compactions


def test_calibration_does_not_serialise_the_request_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that reports usage asks for `last_raw` after every call: the messages and
    tool definitions were serialised when measured, and are not again (a query's result is
    ~15 KB)."""
    from orchestrator.agent import budget

    convo = conversation(window=100_000)
    counter = convo.counter
    assert counter is not None
    with_plan(convo)
    for number in range(1, 4):
        transaction(convo, number, size=2000)
    messages = convo.prepare(TOOLS)
    expected = counter.raw(messages, TOOLS)
    dumped: list[object] = []
    original = budget._dump
    monkeypatch.setattr(budget, "_dump", lambda value: dumped.append(value) or original(value))
    assert convo.last_raw == expected
    assert dumped == []


def test_a_context_overflow_says_where_the_tokens_are() -> None:
    """Before, only the total: who reads `tasks show` could not tell a result (narrow the query,
    lower a source's max_chars) from the tool definitions (LLM_MAX_TOOLS) or the model's own
    reasoning."""
    convo = conversation(window=2000)
    transaction(convo, 1, calls=2, size=10)
    transaction(convo, 2, calls=2, size=900)
    with pytest.raises(ContextOverflow) as caught:
        convo.prepare(TOOLS)
    said = str(caught.value)
    assert "tool definitions about" in said
    assert "its largest part the result of call_api t2c0" in said or (
        "its largest part the result of call_api t2c1" in said
    )


@pytest.mark.parametrize(("calls", "said"), [(1, False), (3, True)])
def test_a_context_overflow_says_when_the_latest_turn_made_several_calls(
    calls: int, said: bool
) -> None:
    """Each result of a turn needs room of its own: before, the line named the largest result
    alone, and an operator narrowed a query that was not the trouble."""
    convo = conversation(window=2000)
    transaction(convo, 1, calls=calls, size=2400 // calls)
    with pytest.raises(ContextOverflow) as caught:
        convo.prepare(TOOLS)
    line = str(caught.value)
    several = f"({calls} tool calls in one turn, each result with room of its own: a model"
    assert (several in line) is said
