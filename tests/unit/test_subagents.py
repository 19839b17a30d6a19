"""Read-only sub-agents: refused at the host on every call, 4 running / 8 active, 12,000 chars,
and the round and session rules of delegation."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.compaction import Compaction, TranscriptHook
from orchestrator.agent.host import ToolHost
from orchestrator.agent.model import Model, ModelTurn
from orchestrator.agent.request import TRANSCRIPT, AgentContext
from orchestrator.agent.subagents import (
    MAX_ACTIVE,
    MAX_RESULT_CHARS,
    MAX_RUNNING,
    SUBAGENTS,
    Delegate,
    RoundDelegations,
    SubAgentRegistry,
    SubAgentRun,
)
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult


class _Args(ToolArguments):
    pass


class Reader(Tool):
    name = "read_things"
    description = "read things"
    arguments = _Args

    def __init__(self) -> None:
        self.calls = 0

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.calls += 1
        return ToolResult.ok({"things": [1, 2]})


class Planner(Reader):
    name = "publish_execution_plan"
    effect = "internal_write"


class Secret(Reader):
    name = "read_secret"
    effect = "sensitive_read"


class Writer(Reader):
    name = "write_things"
    effect = "write"


def host_with(*tools: Tool) -> ToolHost:
    return ToolHost([*tools, Delegate()], ledger=None)


def ctx(**extras: Any) -> ToolContext:
    return ToolContext(owner="task:t", session_id="s1", round_id="intent:1", extras=extras)


class Waiting(Model):
    """A sub-agent model that answers `text` once `release` is set."""

    def __init__(self, release: threading.Event, text: str = "found it") -> None:
        self.release = release
        self.text = text

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        self.release.wait(10)
        return ModelTurn(content=self.text, tool_calls=())


def delegations(
    host: ToolHost, model: Any, stop: threading.Event | None = None
) -> RoundDelegations:
    return RoundDelegations(
        "s1", SubAgentRun(model=model, host=host, max_turns=5, stop=stop or threading.Event())
    )


def test_every_write_is_refused_at_the_host_with_what_it_may_call_instead() -> None:
    reader, planner, secret, writer = Reader(), Planner(), Secret(), Writer()
    host = host_with(reader, planner, secret, writer)
    readonly = ToolContext(owner="task:t", session_id="s1", round_id="r/sub1", readonly=True)
    calls = [
        ToolCall("a", "publish_execution_plan", {}),
        ToolCall("b", "write_things", {}),
        ToolCall("c", "read_secret", {}),
        ToolCall("d", "delegate", {"question": "and you?"}),
        ToolCall("e", "read_things", {}),
    ]
    for _ in range(2):  # on every call, not once
        results = host.run_turn(readonly, calls)
        assert [r.status for r in results] == ["failed"] * 4 + ["succeeded"]
        assert {r.code for r in results[:4]} == {"readonly"}
        for result in results[:4]:
            assert result.message is not None
            assert "It may call instead: read_things." in result.message
    assert (planner.calls, writer.calls, secret.calls, reader.calls) == (0, 0, 0, 2)


def test_a_sub_agent_runs_its_own_loop_and_its_answer_is_capped() -> None:
    reader = Reader()
    host = host_with(reader)
    release = threading.Event()
    release.set()
    long_answer = "x" * (MAX_RESULT_CHARS + 500)
    rounds = delegations(host, lambda: Waiting(release, long_answer))
    result = host.run_turn(
        ctx(**{SUBAGENTS: rounds}), [ToolCall("d1", "delegate", {"question": "why?"})]
    )[0]
    assert result.status == "succeeded"
    assert len(result.payload["answer"]) == MAX_RESULT_CHARS
    assert result.payload["truncated"] is True
    assert result.payload["ended"] == "final_answer"


def test_at_most_4_run_and_8_are_active() -> None:
    release = threading.Event()
    host = host_with(Reader())
    rounds = delegations(host, lambda: Waiting(release))
    with ThreadPoolExecutor(max_workers=10) as pool:
        futures = [pool.submit(rounds.delegate, ctx(), f"q{k}") for k in range(10)]
        for _ in range(100):  # two of ten are refused at once: eight are already active
            if sum(f.done() for f in futures) >= 2:
                break
            release.wait(0.05)
        refused = [f.result() for f in futures if f.done()]
        assert [r.code for r in refused] == ["too_many_subagents"] * 2
        assert rounds.peak_running == MAX_RUNNING  # four run, four wait for a slot
        release.set()
        results = [f.result(timeout=10) for f in futures]
    assert sum(r.status == "succeeded" for r in results) == MAX_ACTIVE
    assert rounds.peak_running == MAX_RUNNING
    assert rounds.started == MAX_ACTIVE


def test_rounds_end_and_sessions_close() -> None:
    release = threading.Event()
    release.set()
    host = host_with(Reader())
    registry = SubAgentRegistry()
    run = SubAgentRun(
        model=lambda: Waiting(release), host=host, max_turns=3, stop=threading.Event()
    )
    first = registry.open_round("s1", run)
    assert first.delegate(ctx(), "q").status == "succeeded"
    registry.end_round("s1")
    ended = first.delegate(ctx(), "q")
    assert (ended.code, ended.message) == (
        "delegation_closed",
        "no new delegation: the round ended",
    )
    second = registry.open_round("s1", run)  # the next round of the same session
    assert second.delegate(ctx(), "q").status == "succeeded"
    registry.close_session("s1")
    assert second.delegate(ctx(), "q").code == "delegation_closed"
    third = registry.open_round("s1", run)
    closed = third.delegate(ctx(), "q")
    assert closed.message == "no new delegation: the session is closed"


class Hook:
    def __init__(self) -> None:
        self.children: list[str] = []

    def compacted(self, compaction: Compaction) -> None:
        pass

    def subagent(self, parent_call_id: str) -> TranscriptHook:
        self.children.append(parent_call_id)
        return self


def test_sub_agent_turns_go_under_the_parent_call() -> None:
    release = threading.Event()
    release.set()
    host = host_with(Reader())
    hook = Hook()
    rounds = delegations(host, lambda: Waiting(release))
    host.run_turn(
        ctx(**{SUBAGENTS: rounds, TRANSCRIPT: hook}),
        [ToolCall("d7", "delegate", {"question": "q"})],
    )
    assert hook.children == ["d7"]


def test_without_a_round_there_is_no_delegation() -> None:
    result = host_with(Reader()).run_turn(ctx(), [ToolCall("d", "delegate", {"question": "q"})])
    assert result[0].code == "delegation_closed"


class Bulky(Reader):
    """A large read: its preview takes a tenth of the window (the most a preview may)."""

    name = "read_bulk"

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.calls += 1
        return ToolResult.ok({"rows": ["水质 reading " * 40 for _ in range(40)]})


#: Parallel reads in the sub-agent's first turn: their previews, a tenth of the window each,
#: outgrow it together.
PARALLEL_READS = 14


class ReadsThenAnswers(Model):
    """Calls `read_bulk` PARALLEL_READS times in one turn, then answers; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        self.calls += 1
        if self.calls == 1:
            calls = tuple(ToolCall(f"b{n}", "read_bulk", {}) for n in range(PARALLEL_READS))
            return ModelTurn(content=None, tool_calls=calls)
        return ModelTurn(content="all quiet", tool_calls=())


def test_a_sub_agent_whose_kept_parts_outgrow_the_window_fails_clearly() -> None:
    """Seed 000: a sub-agent uses the main agent's request budget and compaction; when its
    latest tool transaction or its fixed prompt alone outgrows the window, it fails clearly
    (`context_overflow`), never answering from a history with the key content dropped."""
    context = AgentContext(ContextBudget(1_200), TokenCounter())
    bulky = Bulky()
    host = host_with(bulky)
    model = ReadsThenAnswers()
    rounds = RoundDelegations(
        "s1",
        SubAgentRun(
            model=lambda: model, host=host, max_turns=5, stop=threading.Event(), context=context
        ),
    )
    # The latest tool transaction (the reads and their previews) does not fit.
    result = rounds.delegate(ctx(), "are the readings normal?")
    assert (result.status, result.code) == ("failed", "context_overflow")
    assert result.message is not None
    assert result.message.startswith("the sub-agent ran out of context")
    # Never asked again without the transaction.
    assert (bulky.calls, model.calls) == (PARALLEL_READS, 1)
    # The fixed prompt alone (system prompt and question) does not fit: the model is not asked.
    model.calls = 0
    too_long = rounds.delegate(ctx(), "why? " * 1_500)
    assert (too_long.status, too_long.code) == ("failed", "context_overflow")
    assert model.calls == 0
