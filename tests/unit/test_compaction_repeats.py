"""A transaction above about a quarter of the window (here: the agent republishing a large
plan every other turn; its arguments and its result both hold the plan) cannot be followed by
another one without a compaction. The compaction made when such a transaction arrives cannot
reach its target (the transaction itself must stay), and the next turn's compaction folds it
anyway. Before, both asked the model for a summary: two model calls every turn, the second
re-summarising what the first had just written. Now the compaction that cannot reach its target
carries the summary on with a digest of the turns it folds, and only a compaction that reaches
its target asks the model."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.compaction import SUMMARY_PREFIX
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.model import Model, ModelTurn
from orchestrator.agent.request import AgentContext
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from tests.unit.test_compaction import UsageTurn, assert_strict

WINDOW = 4096
TURNS = 16


class _ReadArgs(ToolArguments):
    n: int = 0


class ReadMeter(Tool):
    name = "read_meter"
    description = "one meter reading"
    arguments = _ReadArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"reading": "turbidity 0.4 NTU " * 10})


class _PlanArgs(ToolArguments):
    nodes: list[dict[str, Any]] = []


class PublishPlan(Tool):
    name = "publish_execution_plan"
    description = "publish the plan"
    arguments = _PlanArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"revision": 1, "nodes": args.nodes})


NODES = [
    {"id": f"n{i}", "status": "pending", "title": "check the district meter " * 2}
    for i in range(30)
]


class Replanner(Model):
    """Reads a meter, republishes the whole plan, reads, republishes...; then answers."""

    def __init__(self) -> None:
        self.turns = 0
        self.summaries = 0
        self.requests: list[list[dict[str, Any]]] = []

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        if messages[0]["content"].startswith("Summarise"):
            self.summaries += 1
            return ModelTurn(content="the model's summary of the meters " * 200, tool_calls=())
        self.requests.append(list(messages))
        self.turns += 1
        usage = {"prompt_tokens": TokenCounter().raw(messages, tools)}
        if self.turns > TURNS:
            return UsageTurn(content="done", tool_calls=(), usage=usage)
        if self.turns % 2:
            call = ToolCall(f"r{self.turns}", "read_meter", {"n": self.turns})
        else:
            call = ToolCall(f"p{self.turns}", "publish_execution_plan", {"nodes": NODES})
        return UsageTurn(content=None, tool_calls=(call,), usage=usage)


def test_a_large_transaction_every_other_turn_is_not_summarised_twice() -> None:
    model = Replanner()
    context = AgentContext(ContextBudget(WINDOW, 512), TokenCounter())
    end = run_round(
        model,
        ToolHost([ReadMeter(), PublishPlan()], ledger=None),
        ToolContext(owner="o", session_id="s", round_id="r"),
        brief="why is the water turbid: " + "a resident reports brown water at the tap. " * 30,
        max_turns=TURNS + 2,
        stop=threading.Event(),
        context=context,
    )
    assert (end.why, end.final_text) == ("final_answer", "done")
    for messages in model.requests:
        assert_strict(messages)
        assert context.counter.raw(messages, []) <= context.budget.request_limit
    # The history was compacted most turns (the window holds one plan transaction at a time)...
    summaries = [
        m["content"]
        for m in model.requests[-1]
        if m["role"] == "user" and m["content"].startswith(SUMMARY_PREFIX)
    ]
    assert summaries
    # ...but the model was asked for a summary at most every other turn, not every turn.
    assert 0 < model.summaries <= TURNS // 2
    # What a compaction folded without asking is in the summary as its receipts' digest, after
    # the model's summary it carries on; the next summary call is shown both.
    carried = [
        m["content"]
        for messages in model.requests
        for m in messages
        if m["role"] == "user"
        and m["content"].startswith(SUMMARY_PREFIX + "the model's")
        and "- read_meter [r" in m["content"]
    ]
    assert carried
