"""The reads of a turn a small context window cannot hold beside the others wait for a later
turn (`agent.turn_room`): the host asks how many fit before anything runs, never leaves a write,
and `no_room` is the model's doing for the repeated-refusal rule (`agent.repeats`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.model import ScriptedModel
from orchestrator.agent.repeats import SAME_FAILURE_LIMIT, RepeatedRefusals
from orchestrator.agent.request import AgentContext, RequestBuilder
from orchestrator.agent.turn_room import NO_ROOM, TURN_FIT, Planned, TurnFit, no_room
from orchestrator.tools.base import ToolCall, ToolContext, ToolResult
from tests.unit.test_host import Scripted, _calls


class Fit:
    """A window that holds `runs` of a turn's reads; keeps what the host planned."""

    def __init__(self, runs: int | None) -> None:
        self.runs = runs
        self.planned: list[list[Planned]] = []

    def __call__(self, planned: Sequence[Planned]) -> TurnFit | None:
        self.planned.append(list(planned))
        if self.runs is None:
            return None
        return TurnFit(self.runs, no_room(len(planned), len(planned) - 1, 4096))


def _turn(fit: Fit, *texts: str) -> tuple[Scripted, list[ToolResult]]:
    tool = Scripted()
    ctx = ToolContext("alice", "s1", "r1", extras={TURN_FIT: fit})
    return tool, ToolHost([tool], ledger=None).run_turn(ctx, _calls(*texts))


def test_the_reads_after_those_that_fit_are_not_run() -> None:
    tool, results = _turn(Fit(1), "a", "b", "c")
    assert tool.ran == ["a"]
    assert results[0].status == "succeeded"
    for result in results[1:]:
        assert (result.status, result.code) == ("failed", NO_ROOM)
        assert result.message == (
            "not run: the context window (4096 tokens) holds the results of 2 of this turn's 3 "
            "calls; make this call again in a later turn, at most 2 calls a turn"
        )


def test_a_write_always_runs_and_a_refusal_is_planned_as_answered() -> None:
    fit = Fit(0)
    tool, results = _turn(fit, "a", "refuse", "internal", "b")
    assert tool.ran == ["internal"]  # a store write (plan, proposal, report) is never left
    assert [result.code for result in results] == [NO_ROOM, "invalid_arguments", None, NO_ROOM]
    [planned] = fit.planned
    assert [plan.kind for plan in planned] == ["read", "answered", "write", "read"]
    assert planned[1].answer == results[1]
    assert [plan.call_id for plan in planned] == ["c0", "c1", "c2", "c3"]


def test_every_call_runs_when_they_fit_and_one_call_asks_nothing() -> None:
    fit = Fit(None)
    tool, results = _turn(fit, "a", "b", "c")
    assert sorted(tool.ran) == ["a", "b", "c"]
    assert all(result.status == "succeeded" for result in results)
    tool, _ = _turn(fit, "a")
    assert tool.ran == ["a"]
    assert len(fit.planned) == 1  # the single call did not ask


# -- the repeated-refusal rule ------------------------------------------------------------------

QUERIES = [
    ToolCall(f"q{n}", "query_data_source", {"point": point}) for n, point in enumerate("ABC")
]
RAN = ToolResult.ok({"rows": []})
LEFT = no_room(3, 1, 4096)


def test_the_same_calls_every_turn_are_stuck() -> None:
    """The model sends the same three queries every turn: the first runs each time, the other
    two never do. It is stuck, as a model that repeats a refused call is."""
    refusals = RepeatedRefusals()
    why = None
    for _ in range(SAME_FAILURE_LIMIT):
        why = refusals.observe(QUERIES, [RAN, LEFT, LEFT])
    assert why is not None
    assert "query_data_source: no_room: not run: the context window (4096 tokens)" in why


def test_making_the_rest_in_later_turns_is_progress() -> None:
    """Each turn runs a call it did not run before (the first of those left, with one more
    behind them): the count starts again every turn."""
    refusals = RepeatedRefusals()
    calls = [ToolCall(f"q{n}", "query_data_source", {"point": f"P{n}"}) for n in range(12)]
    for first in range(len(calls) - 2):
        turn = calls[first : first + 3]
        assert refusals.observe(turn, [RAN, LEFT, LEFT]) is None


def test_going_round_the_reads_already_run_is_stuck() -> None:
    """Three turns that each run a read the one before did not, then the same three again:
    no read is new any more, and the calls left for later come a third time."""
    refusals = RepeatedRefusals()
    turns = [QUERIES, [*QUERIES[1:], ToolCall("q3", "query_data_source", {"point": "D"})]]
    turns.append([QUERIES[2], ToolCall("q4", "query_data_source", {"point": "E"})])
    said = [
        refusals.observe(turn, [RAN] + [LEFT] * (len(turn) - 1))
        for turn in turns * SAME_FAILURE_LIMIT
    ]
    # Progress at each of the first three; the left calls then come in turns 3, 4 and 5.
    assert [why is not None for why in said[:5]] == [False] * 4 + [True]
    assert "query_data_source: no_room: not run" in (said[4] or "")


# -- the request builder's arithmetic -----------------------------------------------------------


def _fit(
    window: int, *kinds: str, least: int = 1000, cited: bool = True
) -> tuple[RequestBuilder, TurnFit | None]:
    """A turn of calls of `kinds` (`read`, `write`) in a window of `window` tokens, each read
    shown at its least as `least` tokens or so: what the builder says runs."""
    builder = RequestBuilder(
        ScriptedModel([]),
        None,
        [],
        ToolContext(owner="o", session_id="s", round_id="r"),
        system="s",
        brief="b",
        stop=threading.Event(),
        context=AgentContext(ContextBudget(window, max_output_tokens=256), TokenCounter()),
    )
    builder.build()
    calls = [
        {"id": f"c{n}", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        for n in range(len(kinds))
    ]
    builder.add_assistant({"role": "assistant", "content": None, "tool_calls": calls})
    text = json.dumps({"rows": [], "truncation": "word " * least})
    planned = [
        Planned(f"c{n}", "read", least=text, cited=cited)
        if kind == "read"
        else Planned(f"c{n}", "write")
        for n, kind in enumerate(kinds)
    ]
    fit = builder.ctx.extras[TURN_FIT]
    return builder, fit(planned)


def test_the_builder_runs_the_reads_that_fit_and_gives_them_the_room_of_the_others() -> None:
    builder, turn = _fit(4096, "read", "read", "read")
    assert turn is not None
    assert turn.runs == 2
    assert "holds the results of 2 of this turn's 3 calls" in (turn.answer.message or "")
    # The room is shared by the two that run, less the third's short answer.
    assert builder._room() > 1000
    _, turn = _fit(8192, "read", "read", "read")
    assert turn is None  # all fit: every call runs


def test_reads_of_a_tool_that_records_no_evidence_need_no_room_for_a_record() -> None:
    """The host's record (its keys and about 139 characters) is beside an answer only when
    the tool records evidence: three reads that leave one out with it all run without it."""
    _, turn = _fit(4096, "read", "read", "read")
    assert turn is not None
    assert turn.runs == 2
    _, turn = _fit(4096, "read", "read", "read", cited=False)
    assert turn is None


def test_the_builder_leaves_every_read_beside_a_write_but_never_the_write() -> None:
    _, turn = _fit(1200, "write", "read", "read")
    assert turn is not None
    assert turn.runs == 0
    # The first read runs when there is no write, even if it alone may not fit.
    _, turn = _fit(1200, "read", "read")
    assert turn is None


def test_writes_that_alone_do_not_fit_leave_every_call_to_run() -> None:
    _, turn = _fit(700, "write", "write", "write", "write", "read", least=10)
    assert turn is None
