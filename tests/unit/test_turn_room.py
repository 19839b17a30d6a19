"""The reads of a turn a small context window cannot hold beside the others wait for a later
turn (`agent.turn_room`): the host asks how many fit before anything runs, never leaves a write,
and `no_room` is the model's doing for the repeated-refusal rule (`agent.repeats`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.agent import receipted
from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.deadline import timed_out
from orchestrator.agent.host import MASKED_NOTE, ToolHost
from orchestrator.agent.model import ScriptedModel
from orchestrator.agent.repeats import SAME_FAILURE_LIMIT, RepeatedRefusals
from orchestrator.agent.request import AgentContext, RequestBuilder
from orchestrator.agent.result_room import ResultRoom
from orchestrator.agent.sensitive import noted
from orchestrator.agent.turn_room import NO_ROOM, TURN_FIT, Planned, TurnFit, no_room
from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.outcomes import OUTCOMES, model_message, tool_status
from orchestrator.store.receipts import Receipt
from orchestrator.tools.base import Tool, ToolCall, ToolContext, ToolResult
from tests.unit.test_host import CTX, Echo, EchoArgs, Scripted, _calls


class Fit:
    """A window that holds `runs` of a turn's reads; keeps what the host planned."""

    def __init__(self, runs: int | None) -> None:
        self.runs = runs
        self.planned: list[list[Planned]] = []

    def __call__(self, planned: Sequence[Planned]) -> TurnFit | None:
        self.planned.append(list(planned))
        if self.runs is None:
            return None
        left = [plan for plan in planned if plan.kind == "read"][self.runs :]
        answer = no_room(len(planned), len(planned) - 1, 4096)
        return TurnFit(self.runs, (answer,) * len(left))


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


def test_every_call_runs_when_they_fit_and_one_call_always_runs() -> None:
    fit = Fit(None)
    tool, results = _turn(fit, "a", "b", "c")
    assert sorted(tool.ran) == ["a", "b", "c"]
    assert all(result.status == "succeeded" for result in results)
    # A single call is told (its answer's room depends on what it is), and never left.
    fit = Fit(0)
    tool, _ = _turn(fit, "internal")
    assert tool.ran == ["internal"]
    assert [[plan.kind for plan in turn] for turn in fit.planned] == [["write"]]
    assert fit.planned[0][0].receipted is False  # a store write: no receipt in its answer
    tool, _ = _turn(fit, "a")
    assert tool.ran == ["a"]


class LookUp(Echo):
    """A quick read of the store's own records (`Tool.look_up`)."""

    name = "look_up"
    look_up = True


def test_a_look_up_left_for_later_runs_and_is_shown_only_if_no_larger_than_no_room() -> None:
    """The window holds the first read: a short look-up after it is answered as it ran (it
    takes no more room than the no_room answer would), a long one is answered that it was
    not shown, and a read that is not a look-up is not run."""
    held = no_room(4, 1, 4096, ran=True)
    planned: list[Planned] = []

    def fit(plans: Sequence[Planned]) -> TurnFit:
        planned.extend(plans)
        # The reads left in the order the window holds them: the look-ups last.
        answers = (no_room(4, 1, 4096), held, held)
        return TurnFit(1, answers, lambda than, r: len(r.message_text) <= len(than.message_text))

    echo, look = Echo(), LookUp()
    ctx = ToolContext("alice", "s1", "r1", extras={TURN_FIT: fit})
    calls = [
        ToolCall("c0", "echo", {"text": "first"}),
        ToolCall("c1", "look_up", {"text": "short"}),
        ToolCall("c2", "look_up", {"text": "long " * 100}),
        ToolCall("c3", "echo", {"text": "later"}),
    ]
    results = ToolHost([echo, look], ledger=None).run_turn(ctx, calls)
    assert [plan.look_up for plan in planned] == [False, True, True, False]
    assert (echo.calls, look.calls) == (1, 2)
    assert [result.payload for result in results[:2]] == ["first", "short"]
    assert results[2] == held
    assert results[2].message is not None
    assert results[2].message.startswith("not shown: the context window (4096 tokens) holds")
    assert results[3].message is not None
    assert results[3].message.startswith("not run: the context window (4096 tokens) holds")


def test_look_ups_run_first_and_the_room_they_leave_goes_to_the_calls_after() -> None:
    """A read beside two look-ups: each was given an equal share of the room, though a
    look-up's answer takes a few tokens of it. Now the look-ups run first, the builder is told
    their answers (`TURN_ANSWERED`), and the read is fitted to the room they leave."""
    order: list[str] = []
    rooms: list[int] = []

    class Looks(LookUp):
        def run(self, ctx: ToolContext, args: Any) -> ToolResult:
            order.append(args.text)
            return super().run(ctx, args)

    class Reads(Echo):
        def run(self, ctx: ToolContext, args: Any) -> ToolResult:
            order.append(args.text)
            rooms.append(_room_of(builder)._room())
            return super().run(ctx, args)

    host = ToolHost([Reads(), Looks()], ledger=None)
    builder = _builder(host.tools, window=2048)
    calls = [
        ToolCall("c0", "echo", {"text": "read"}),
        ToolCall("c1", "look_up", {"text": "one"}),
        ToolCall("c2", "look_up", {"text": "two"}),
    ]
    builder.add_assistant(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": "{}"}}
                for c in calls
            ],
        }
    )
    results = host.run_turn(builder.ctx, calls)
    assert [result.payload for result in results] == ["read", "one", "two"]
    assert order[-1] == "read"
    # Each look-up's answer takes a few tokens: the read has nearly all the room, not a third.
    room = _room_of(builder)
    room._known, room._rooms = {}, {}
    shared = room._room()
    assert rooms == [rooms[0]]
    assert rooms[0] > 2 * shared


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
    [answer] = turn.answers
    assert "holds the results of 2 of this turn's 3 calls" in (answer.message or "")
    # The room is shared by the two that run, less the third's short answer.
    assert _room_of(builder)._room() > 1000
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


def test_reads_left_after_the_first_are_told_in_fewer_words_when_that_alone_fits() -> None:
    """Five reads whose first at its least leaves no room for four no_room answers in full
    (about 82 tokens each): every call ran, and the next request overflowed. Now the first
    read left is told in full how many calls the window holds, and the others in fewer words
    that still say they did not run and to make them in a later turn; in a larger window
    every one is told in full."""
    builder, turn = _fit(1150, "read", "read", "read", "read", "read", least=200)
    assert turn is not None
    assert turn.runs == 1
    first, *others = turn.answers
    assert first == no_room(5, 1, 1150)
    assert others == [no_room(5, 1, 1150, short=True)] * 3
    assert others[0].message == (
        "not run: no room in this turn; make it again in a later turn, with fewer calls"
    )
    counter = builder.context.counter  # type: ignore[union-attr]
    assert counter.text(others[0].message_text) < counter.text(first.message_text) - 15
    _, turn = _fit(1250, "read", "read", "read", "read", "read", least=200)
    assert turn is not None
    assert turn.answers == (no_room(5, 1, 1250),) * 4


def test_a_first_read_that_fits_a_turn_of_its_own_but_not_beside_the_others_waits_too() -> None:
    """Eight reads: the turn's own message and seven answers, told in as few words as they
    are, leave the first read no room, though it fits a turn of its own. Every call ran and the
    next request overflowed; now every read waits, the first told that none of the turn's
    calls fit together and to make one a turn. A first read that does not fit a turn of its
    own still runs (the request then fails, naming the turn's calls)."""
    _, turn = _fit(1100, *["read"] * 8, least=150)
    assert turn is not None
    assert turn.runs == 0
    first, *others = turn.answers
    assert first.message == (
        "not run: the context window (1100 tokens) holds the results of none of this turn's 8 "
        "calls together; make this call again in a later turn, at most 1 call a turn"
    )
    assert others == [no_room(8, 0, 1100, short=True)] * 7
    _, turn = _fit(1100, *["read"] * 8, least=700)
    assert turn is None


def test_writes_that_alone_do_not_fit_leave_every_call_to_run() -> None:
    _, turn = _fit(700, "write", "write", "write", "write", "read", least=10)
    assert turn is None


# -- a write's answer -----------------------------------------------------------------------------

INVOCATION = "0f1e2d3c-4b5a-4968-a7b6-c5d4e3f2a1b0"  # as `store.receipts` makes them


class Verifies(Echo):
    """A write tool whose read-back says `verdict`."""

    name = "write_thing"
    effect = "write"
    identity = "intent"

    def __init__(self, verdict: bool | None = None) -> None:
        super().__init__()
        self.verdict = verdict

    def verify(self, ctx: ToolContext, args: Any) -> bool | None:
        return self.verdict


class Recorded(Verifies):
    """A write tool whose answers carry the host's evidence record (a call_api write's)."""

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts | None:
        return None


def _write_answers() -> list[ToolResult]:
    """Every answer a receipt-backed write is given by the host (`agent.receipted`,
    `agent.deadline`), without the tool's payload: each outcome's, an identical call's settled
    this round, an unresolved earlier one's (with its small payload), one given up at the
    time limit."""
    answers = [
        ToolResult(
            status=tool_status(outcome),
            message=model_message(outcome),
            invocation_id=INVOCATION,
            code=outcome,
        )
        for outcome in OUTCOMES
    ]
    now = datetime.now(UTC)
    for status in ("succeeded", "pending", "failed", "running", "unknown"):
        receipt = Receipt(INVOCATION, "o", "s", "write_thing", "k", "d", "t", status, "", now, now)
        for verdict in (False, None):
            tool = Verifies(verdict)
            args = EchoArgs(text="x")
            answers.append(receipted._existing(None, CTX, tool, args, receipt, None))  # type: ignore[arg-type]
        answers.append(timed_out("write_thing", 30, write=True, receipt=receipt))
    return answers


def _builder(tools: dict[str, Tool] | None = None, window: int = 4096) -> RequestBuilder:
    builder = RequestBuilder(
        ScriptedModel([]),
        tools,
        [],
        ToolContext(owner="o", session_id="s", round_id="r"),
        system="s",
        brief="b",
        stop=threading.Event(),
        context=AgentContext(ContextBudget(window, max_output_tokens=256), TokenCounter()),
    )
    builder.build()
    return builder


@pytest.mark.parametrize("cited", [False, True])
def test_a_writes_room_counts_its_receipt_id_and_the_hosts_message(cited: bool) -> None:
    """A write's answer carries its receipt's id and the host's message (up to about 80
    tokens: an unresolved earlier write's), which a read's does not: its room counted them
    not, and a write's answer could be larger than the room kept for it. Now the room around
    a write's result (what `_room` leaves it) and its least (what the turn's fit reserves)
    hold each answer the host gives."""
    tool = Recorded() if cited else Verifies()
    assert tool.records_evidence() is cited
    builder = _builder({tool.name: tool})
    counter = builder.context.counter  # type: ignore[union-attr]
    call = {"id": "w1", "type": "function", "function": {"name": tool.name, "arguments": "{}"}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    builder.add_assistant(assistant)
    plan = Planned("w1", "write", cited=cited, receipted=True)
    assert builder.ctx.extras[TURN_FIT]([plan]) is None  # one call: nothing left
    around = _room_of(builder)._turn_tokens() - counter.message(assistant)
    least = _room_of(builder)._least(plan, "w1")
    for answer in _write_answers():
        bare = replace(answer, payload=None)
        assert around >= counter.message(_message(bare)), bare.message
        assert least >= counter.message(_message(answer)), answer.message


def test_a_masked_writes_room_counts_the_note_it_is_answered_with() -> None:
    tool = Verifies()
    builder = _builder({tool.name: tool})
    counter = builder.context.counter  # type: ignore[union-attr]
    plan = Planned("w1", "write", cited=False, receipted=True, masked=True)
    longest = max(_write_answers(), key=lambda answer: counter.message(_message(answer)))
    noted_answer = replace(longest, message=noted(longest.message, MASKED_NOTE))
    room = _room_of(builder)
    assert room._least(plan, "w1") >= counter.message(_message(noted_answer))
    assert room._least(plan, "w1") > room._least(replace(plan, masked=False), "w1")


def _message(answer: ToolResult) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "w1", "content": answer.message_text}


def _room_of(builder: RequestBuilder) -> ResultRoom:
    """The builder's room of the running turn's results (it has a window)."""
    assert builder.room is not None
    return builder.room
