"""The count of turns whose calls were all refused the same way (`agent.repeats`)."""

from __future__ import annotations

from orchestrator.agent.repeats import SAME_FAILURE_LIMIT, RepeatedRefusals
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


def test_a_call_that_ran_or_another_refusal_starts_the_count_again() -> None:
    ran = ToolResult.ok({"rows": []})
    other = ToolResult.failed("unknown source 'y'", code="unknown_source")
    refusals = RepeatedRefusals()
    turns = [[(CALL, REFUSED)], [(CALL, REFUSED)], [(CALL, ran)], [(CALL, REFUSED)]]
    turns += [[(CALL, REFUSED)], [(CALL, other)], [(CALL, REFUSED)], [(CALL, REFUSED)]]
    # Beside the same refusal, a call that ran with other arguments each time.
    turns += [
        [(CALL, REFUSED), (ToolCall("c2", "query_data_source", {"point": point}), ran)]
        for point in ("a", "b", "c", "d")
    ]
    assert not any(_turns(refusals, turns))


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
