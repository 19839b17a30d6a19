"""More cases of the state decision table: what the agent declares is not the whole story."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orchestrator.domain.decisions import RoundFacts, decide


def node(node_id: str, status: str, actor: str = "agent") -> dict[str, Any]:
    return {"id": node_id, "status": status, "actor": actor}


def facts(
    nodes: list[dict[str, Any]] | None,
    report: str | None,
    pending: int = 0,
    rounds_done: int = 0,
    max_rounds: int = 5,
) -> RoundFacts:
    return RoundFacts(nodes, report, pending, rounds_done, max_rounds)


@pytest.mark.parametrize(
    "nodes",
    [
        [node("a", "running")],
        [node("a", "completed"), node("b", "waiting")],
        [node("a", "pending"), node("h", "skipped", actor="human")],
    ],
)
def test_report_waiting_with_nothing_to_wait_for_continues(nodes: list[dict[str, Any]]) -> None:
    # No pending approval, no open human node: a `waiting` task would wait for nobody.
    decision = decide(facts(nodes, "waiting"))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert decision.queues_next
    assert decision.failure_code is None


def test_report_waiting_with_no_plan_continues() -> None:
    for plan in (None, []):
        decision = decide(facts(plan, "waiting"))
        assert (decision.task_status, decision.outcome) == ("queued", "continue")


@pytest.mark.parametrize("report", ["waiting", "completed", "continue"])
def test_a_round_that_published_no_plan_is_told_to_publish_it(report: str) -> None:
    # Invariant 10: only this generation's plan counts, and it has none. The reason is what
    # the next round's agent reads (`read_task_context`): it must publish, not report again.
    decision = decide(facts(None, report))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert decision.reason.startswith("the round published no plan of its own")
    assert "publish_execution_plan" in decision.reason


def test_report_waiting_with_every_node_done_never_completes() -> None:
    # Invariant 23: a report that declared `waiting` never becomes `completed`.
    nodes = [node("a", "completed"), node("b", "skipped"), node("h", "cancelled", actor="human")]
    decision = decide(facts(nodes, "waiting"))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert decision.reason == "the report declared waiting, but nothing is awaited"


@pytest.mark.parametrize("pending", [1, 3])
@pytest.mark.parametrize(
    "nodes", [None, [], [node("a", "running")], [node("a", "completed"), node("b", "completed")]]
)
def test_pending_actions_without_a_report_wait(
    nodes: list[dict[str, Any]] | None, pending: int
) -> None:
    decision = decide(facts(nodes, None, pending=pending))
    assert (decision.task_status, decision.outcome) == ("waiting", "waiting")
    assert str(pending) in decision.reason
    assert not decision.queues_next


def test_pending_actions_wait_even_at_the_round_limit() -> None:
    decision = decide(facts([node("a", "running")], None, pending=1, rounds_done=4, max_rounds=5))
    assert decision.task_status == "waiting"
    assert decision.failure_code is None


@pytest.mark.parametrize("open_status", ["pending", "running", "waiting", "failed"])
def test_report_completed_with_an_open_agent_node_continues(open_status: str) -> None:
    nodes = [node("a", "completed"), node("b", open_status), node("c", "skipped")]
    decision = decide(facts(nodes, "completed"))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert decision.queues_next


def test_report_completed_with_an_open_agent_node_fails_at_the_round_limit() -> None:
    nodes = [node("a", "completed"), node("b", "running")]
    decision = decide(facts(nodes, "completed", rounds_done=2, max_rounds=3))
    assert (decision.task_status, decision.failure_code) == ("failed", "round_limit")


@pytest.mark.parametrize(
    "nodes",
    [
        None,
        [],
        [node("a", "completed")],
        [node("a", "completed"), node("b", "skipped"), node("c", "cancelled")],
        [node("a", "completed"), node("h", "completed", actor="human")],
    ],
)
@pytest.mark.parametrize(("rounds_done", "max_rounds"), [(0, 5), (3, 5), (4, 5), (0, 1)])
def test_a_round_that_saved_no_report_is_never_completed(
    nodes: list[dict[str, Any]] | None, rounds_done: int, max_rounds: int
) -> None:
    decision = decide(facts(nodes, None, rounds_done=rounds_done, max_rounds=max_rounds))
    assert decision.task_status != "completed"
    assert decision.outcome != "completed"
    if rounds_done + 1 >= max_rounds:
        assert (decision.task_status, decision.failure_code) == ("failed", "round_limit")
    else:
        assert (decision.task_status, decision.outcome) == ("queued", "continue")
        assert "report" in decision.reason


def test_the_same_plan_with_a_report_completes() -> None:
    # The control for the case above: the report alone turns continue into completed.
    nodes = [node("a", "completed"), node("b", "skipped")]
    assert decide(facts(nodes, None)).outcome == "continue"
    assert decide(facts(nodes, "completed")).outcome == "completed"


def test_open_writes_or_running_commands_turn_a_completion_into_waiting() -> None:
    done = [node("a", "completed")]
    base = facts(done, "completed")
    assert decide(base).task_status == "completed"
    writes = decide(replace(base, open_writes=("call_api i1 (pending)", "call_api i2 (unknown)")))
    assert (writes.task_status, writes.outcome) == ("waiting", "waiting")
    assert "call_api i1 (pending)" in writes.reason
    assert "i2 (unknown)" in writes.reason
    commands = decide(replace(base, running_commands=2))
    assert commands.task_status == "waiting"
    assert "2 background command(s) still running" in commands.reason
    many = decide(replace(base, open_writes=tuple(f"w{i} (running)" for i in range(8))))
    assert "and 3 more" in many.reason


def test_only_a_report_declaring_completed_completes() -> None:
    # A `continue` report cites nothing; with every node skipped it must not complete the task.
    nodes = [node("a", "skipped"), node("b", "completed")]
    decision = decide(facts(nodes, "continue"))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert decision.reason == "the report declared continue"
    assert decide(facts(nodes, "completed")).task_status == "completed"
