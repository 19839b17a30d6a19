"""The state decision table, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.domain.decisions import RoundFacts, decide, report_failure


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


def test_report_failed_fails_the_task_whatever_the_plan() -> None:
    decision = decide(facts([node("a", "completed")], "failed", pending=2))
    assert (decision.task_status, decision.outcome) == ("failed", "failed")


def test_a_failed_report_s_reason_is_its_summary_said_as_the_report_s() -> None:
    nodes = [node("a", "completed")]
    decided = decide(RoundFacts(nodes, "failed", 0, 0, 5, report_summary="Valve\n stuck shut."))
    assert decided.reason == "the report declared the task failed: Valve stuck shut."
    assert decided.failure_code == "report_failed"


def test_a_long_summary_is_cut_between_words() -> None:
    said = report_failure("word " * 100 + "end", None)
    assert said.startswith("the report declared the task failed: word word")
    assert said.endswith("word…")
    assert len(said) <= len("the report declared the task failed: ") + 241
    one_word = report_failure("x" * 500, None)
    assert one_word == "the report declared the task failed: " + "x" * 240 + "…"


def test_a_blank_summary_names_the_failed_nodes_and_their_reasons() -> None:
    nodes = [
        node("a", "completed"),
        node("b", "failed") | {"reason": "meter\tgone"},
        node("c", "failed") | {"reason": " "},
    ]
    assert report_failure(" \n ", nodes) == (
        "the report declared the task failed; failed node b: meter gone"
    )
    assert report_failure(None, []) == "the report declared the task failed"


def test_pending_approvals_wait() -> None:
    decision = decide(facts([node("a", "completed")], "completed", pending=1))
    assert (decision.task_status, decision.outcome) == ("waiting", "waiting")


@pytest.mark.parametrize("status", ["pending", "running", "waiting"])
def test_unfinished_human_node_waits_even_when_the_agent_says_completed(status: str) -> None:
    nodes = [node("a", "completed"), node("sample", status, actor="human")]
    decision = decide(facts(nodes, "completed"))
    assert decision.task_status == "waiting"
    assert "sample" in decision.reason


def test_a_failed_human_node_no_longer_waits_and_never_completes() -> None:
    """A person closed it as failed: the agent decides what follows (a retry is a new node)."""
    nodes = [node("a", "completed"), node("sample", "failed", actor="human")]
    decision = decide(facts(nodes, "completed"))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")


def test_all_nodes_done_and_report_saved_completes() -> None:
    nodes = [node("a", "completed"), node("b", "skipped"), node("c", "cancelled", "human")]
    decision = decide(facts(nodes, "completed"))
    assert (decision.task_status, decision.outcome) == ("completed", "completed")
    assert "(1 completed, 1 skipped, 1 cancelled, human step(s) the agent cancelled: c)" in (
        decision.reason
    )


def test_a_completion_with_no_node_completed_says_so() -> None:
    """A plan the agent skipped and cancelled through is done, but its completion must not read
    like work done: the operator sees that no step was completed."""
    nodes = [node("a", "skipped"), node("b", "cancelled"), node("c", "cancelled", "human")]
    decision = decide(facts(nodes, "completed"))
    assert decision.task_status == "completed"
    assert "(none completed, 1 skipped, 2 cancelled, human step(s) the agent cancelled: c)" in (
        decision.reason
    )


def test_a_round_without_a_report_never_completes() -> None:
    decision = decide(facts([node("a", "completed")], None))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")


def test_no_plan_never_completes() -> None:
    assert decide(facts(None, "completed")).outcome == "continue"
    assert decide(facts([], "completed")).outcome == "continue"


def test_open_agent_nodes_continue() -> None:
    decision = decide(facts([node("a", "completed"), node("b", "running")], "continue"))
    assert decision.queues_next


def test_round_limit_fails_instead_of_continuing() -> None:
    decision = decide(facts([node("a", "running")], "continue", rounds_done=4, max_rounds=5))
    assert (decision.task_status, decision.failure_code) == ("failed", "round_limit")
    assert decide(facts([node("a", "running")], "continue", rounds_done=3)).queues_next


def test_round_limit_does_not_block_completion() -> None:
    decision = decide(facts([node("a", "completed")], "completed", rounds_done=4, max_rounds=5))
    assert decision.task_status == "completed"
