"""The count of turns whose calls were all refused the same way (`agent.repeats`)."""

from __future__ import annotations

from orchestrator.agent.repeats import SAME_FAILURE_LIMIT, RepeatedRefusals, calls_made
from orchestrator.store.transcripts import Entry
from orchestrator.tools.base import ToolCall, ToolResult

CALL = ToolCall("c1", "query_data_source", {"source": "x"})
REFUSED = ToolResult.failed("unknown source 'x'", code="unknown_source")


def _turns(
    refusals: RepeatedRefusals, turns: list[list[tuple[ToolCall, ToolResult]]]
) -> list[bool]:
    return [
        refusals.observe([call for call, _ in turn], [result for _, result in turn]) is not None
        for turn in turns
    ]


def test_the_same_refusal_ends_at_the_limit_and_names_it() -> None:
    refusals = RepeatedRefusals()
    ended = _turns(refusals, [[(CALL, REFUSED)]] * SAME_FAILURE_LIMIT)
    assert ended == [False] * (SAME_FAILURE_LIMIT - 1) + [True]
    why = refusals.observe([CALL], [REFUSED])
    assert why is not None
    assert "query_data_source: unknown_source: unknown source 'x'" in why


def test_a_call_that_ran_starts_the_count_again() -> None:
    ran = ToolResult.ok({"rows": []})
    refusals = RepeatedRefusals()
    turns = [[(CALL, REFUSED)], [(CALL, REFUSED)], [(CALL, ran)], [(CALL, REFUSED)]]
    turns += [[(CALL, REFUSED)], [(CALL, OTHER)], [(READ, ran)], [(CALL, REFUSED)]]
    # Beside the same refusal, a call that ran with other arguments each time.
    turns += [
        [(CALL, REFUSED), (ToolCall("c2", "query_data_source", {"point": point}), ran)]
        for point in ("a", "b", "c", "d")
    ]
    assert not any(_turns(refusals, turns))


OTHER = ToolResult.failed("unknown source 'y'", code="unknown_source")
SECOND = ToolCall("c2", "save_reprt", {})
UNKNOWN = ToolResult.failed("unknown tool 'save_reprt'", code="unknown_tool")
READ = ToolCall("c3", "read_task_context", {})


def test_refusals_in_turn_end_once_each_came_the_limit_times() -> None:
    """A, B, A, B, A: no turn is the one before again, and the fifth ends the round, naming
    both; a cycle of three ends at the seventh."""
    refusals = RepeatedRefusals()
    a, b = [(CALL, REFUSED)], [(SECOND, UNKNOWN)]
    assert _turns(refusals, [a, b, a, b, a]) == [False] * 4 + [True]
    why = RepeatedRefusals()
    said = [why.observe([call for call, _ in t], [r for _, r in t]) for t in [a, b, a, b, a]]
    assert said[-1] == (
        "the model made the same 2 refused calls in turn, 5 turns with nothing new run in between, "
        "shown why each time: query_data_source: unknown_source: unknown source 'x'; "
        "save_reprt: unknown_tool: unknown tool 'save_reprt'; it does not correct them, so it "
        "is not asked again for the rest of its turns (ORCH_MAX_TURNS)"
    )
    c = [(CALL, OTHER)]
    assert _turns(RepeatedRefusals(), [a, b, c, a, b, c, a]) == [False] * 6 + [True]


def test_another_refusal_between_does_not_end_the_round_but_does_not_start_it_again() -> None:
    """A new refusal is the model trying something else: that turn does not end the round.
    The same refusal before and after it still counts: it came a third time at the fourth."""
    refusals = RepeatedRefusals()
    said = [
        refusals.observe([call for call, _ in t], [r for _, r in t])
        for t in [[(CALL, REFUSED)], [(CALL, REFUSED)], [(CALL, OTHER)], [(CALL, REFUSED)]]
    ]
    assert [why is not None for why in said] == [False, False, False, True]
    assert (said[-1] or "").startswith(
        "the model made the same refused call 3 times in 4 turns with nothing new run in between, "
        "shown why each time: query_data_source: unknown_source: unknown source 'x'; "
    )


def test_reads_made_before_beside_refusals_in_turn_are_no_progress() -> None:
    """Two reads, each beside its own refusal, in turn: each read ran before, so the refusals
    still come in turn with nothing new run; a read with new arguments starts it again."""
    ran = ToolResult.ok({"rows": []})
    other_read = ToolCall("c4", "query_data_source", {"point": "p"})
    a, b = [(READ, ran), (CALL, REFUSED)], [(other_read, ran), (SECOND, UNKNOWN)]
    assert _turns(RepeatedRefusals(), [a, b, a, b, a, b]) == [False] * 5 + [True]
    fresh = [
        [(ToolCall("c5", "query_data_source", {"point": n}), ran), (CALL, REFUSED)]
        for n in range(6)
    ]
    # The refusal beside each new read counts from the last of them: ends two turns later.
    said = _turns(RepeatedRefusals(), [a, b, *fresh, a, b, a])
    assert said == [False] * (len(fresh) + 4) + [True]


def test_the_same_turn_again_counts_with_a_call_that_ran_beside_the_refusal() -> None:
    """A model that reads the task's context again before the same refused report, turn after
    turn: the read runs (a new evidence id each time), the turn is the same."""
    refusals = RepeatedRefusals()
    read = ToolCall("c2", "read_task_context", {})
    turns = [[(read, ToolResult.ok({"n": n})), (CALL, REFUSED)] for n in range(SAME_FAILURE_LIMIT)]
    assert _turns(refusals, turns)[-1]


def test_failures_outside_the_call_are_not_counted() -> None:
    """A source down or a time limit: the same call may work later, the model is not at
    fault for asking again (and an outcome without a refusal code, a command's non-zero exit,
    is the tool's answer, not a refusal)."""
    for result in (
        ToolResult.failed("scada could not be read: ConnectError", code="source_error"),
        ToolResult.failed("gave no result within 30 s", code="tool_timeout"),
        ToolResult(status="failed", message="The command failed."),
        ToolResult(status="unknown", message="The outcome is unknown.", code="unknown"),
    ):
        refusals = RepeatedRefusals()
        assert not any(_turns(refusals, [[(CALL, result)]] * (SAME_FAILURE_LIMIT + 2)))


def test_a_turn_of_several_refusals_counts_when_all_repeat_in_order() -> None:
    second = ToolCall("c2", "save_reprt", {})
    unknown = ToolResult.failed("unknown tool 'save_reprt'", code="unknown_tool")
    refusals = RepeatedRefusals()
    turn = [(CALL, REFUSED), (second, unknown)]
    assert _turns(refusals, [turn] * SAME_FAILURE_LIMIT)[-1]
    why = refusals.observe([CALL, second], [REFUSED, unknown])
    assert why is not None
    assert "(and 1 more refused call(s))" in why


def test_the_calls_a_round_made_are_compared_whatever_their_order_and_ids() -> None:
    """`calls_made` reads a round's transcript: its own model turns' calls, by tool and
    arguments; a sub-agent's turns, tool results and a body of another shape are not."""

    def turn(*calls: tuple[str, str, dict[str, object]], parent: str | None = None) -> Entry:
        body = {"tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls]}
        return Entry(turn=1, kind="model_turn", body=body, parent_call_id=parent)

    read, query = ("a", "read_task_context", {}), ("b", "query_data_source", {"source": "x"})
    first = calls_made([turn(read), turn(query), Entry(turn=2, kind="model_turn", body={})])
    again = calls_made(
        [
            turn(("c", "query_data_source", {"source": "x"}), ("d", "read_task_context", {})),
            turn(("e", "delegate", {"task": "look"}), parent="c"),
            Entry(turn=1, kind="tool_result", body={"tool_calls": [{"name": "x"}]}),
            Entry(turn=3, kind="model_turn", body=["an", "older", "body"]),  # type: ignore[arg-type]
        ]
    )
    assert first == again == {("read_task_context", "{}"), ("query_data_source", '{"source":"x"}')}
    other = calls_made([turn(read), turn(("b", "query_data_source", {"source": "y"}))])
    assert other != first
