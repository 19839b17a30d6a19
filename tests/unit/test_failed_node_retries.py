"""A failed node and its retry (seed 004: 重试使用新节点, 不形成循环依赖).

A failed node stays failed. It stops holding the task's completion once a retry of it is
completed: a node of the same actor with an edge from the failed node. A human step's retry is
a human node, which only a person completes, so the agent alone never turns a person's failure
into a completion.

The facts here carry no stored relation of retries: they are read by their edges, as a revision
stored before the relation was kept is. That the retry must also be new since the failure (a
node planned after it before it failed is none) is `test_retry_relation.py`.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.domain.decisions import (
    RoundFacts,
    decide,
    unanswered_failed_human_nodes,
    unretried_failed_nodes,
)
from orchestrator.domain.plan_authority import authority_problems
from orchestrator.domain.plans import retry_edge_problems, validate_plan
from orchestrator.domain.retries import retries_by_edges
from orchestrator.errors import ValidationFailed


def node(node_id: str, status: str, actor: str = "agent") -> dict[str, Any]:
    return {"id": node_id, "status": status, "actor": actor}


def edge(source: str, target: str) -> dict[str, Any]:
    return {"from": source, "to": target}


def facts(
    nodes: list[dict[str, Any]],
    edges: list[dict[str, Any]],
    report: str | None = "completed",
    rounds_done: int = 0,
    max_rounds: int = 5,
) -> RoundFacts:
    return RoundFacts(nodes, report, 0, rounds_done, max_rounds, plan_edges=edges)


def unretried(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> list[str]:
    """`unretried_failed_nodes` of a revision stored before the relation was kept."""
    return unretried_failed_nodes(nodes, retries_by_edges(nodes, edges))


def unanswered(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> list[str]:
    """`unanswered_failed_human_nodes` of a revision stored before the relation was kept."""
    return unanswered_failed_human_nodes(nodes, retries_by_edges(nodes, edges))


CHECK = node("check", "completed")
FAILED_SAMPLE = node("sample", "failed", "human")


def test_a_person_failed_human_node_without_a_retry_never_completes() -> None:
    decision = decide(facts([CHECK, FAILED_SAMPLE], [edge("check", "sample")]))
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    # The reason names the node and says how to go on, for the operator and the next round.
    assert "sample" in decision.reason
    assert "retry" in decision.reason
    assert "failed" in decision.reason


def test_a_completed_human_retry_releases_the_failed_human_node() -> None:
    nodes = [CHECK, FAILED_SAMPLE, node("resample", "completed", "human")]
    edges = [edge("check", "sample"), edge("sample", "resample")]
    decision = decide(facts(nodes, edges))
    assert (decision.task_status, decision.outcome) == ("completed", "completed")


def test_the_honest_path_waits_for_the_person_then_completes() -> None:
    edges = [edge("check", "sample"), edge("sample", "resample")]
    for status in ("pending", "running", "waiting"):
        waiting = decide(facts([CHECK, FAILED_SAMPLE, node("resample", status, "human")], edges))
        assert (waiting.task_status, waiting.outcome) == ("waiting", "waiting")
        assert "resample" in waiting.reason
    done = [CHECK, FAILED_SAMPLE, node("resample", "completed", "human")]
    assert decide(facts(done, edges)).task_status == "completed"


def test_an_agent_node_the_agent_completes_is_no_retry_of_a_human_step() -> None:
    """The dishonest agent "retries" the sampling itself and marks its node completed."""
    nodes = [CHECK, FAILED_SAMPLE, node("resample", "completed", "agent")]
    edges = [edge("check", "sample"), edge("sample", "resample")]
    decision = decide(facts(nodes, edges))
    assert decision.task_status != "completed"
    assert "sample" in decision.reason


@pytest.mark.parametrize("status", ["skipped", "cancelled", "failed"])
def test_a_retry_that_did_not_complete_releases_nothing(status: str) -> None:
    """The agent may cancel a human node it added: a cancelled "retry" is no retry."""
    nodes = [CHECK, FAILED_SAMPLE, node("resample", status, "human")]
    edges = [edge("check", "sample"), edge("sample", "resample")]
    decision = decide(facts(nodes, edges))
    assert decision.task_status != "completed"
    assert "sample" in decision.reason


def test_a_completed_node_not_depending_on_the_failed_one_is_no_retry() -> None:
    # Without the edge from the failed node, nothing says the new node takes its place.
    nodes = [CHECK, FAILED_SAMPLE, node("resample", "completed", "human")]
    decision = decide(facts(nodes, [edge("check", "sample"), edge("check", "resample")]))
    assert decision.task_status != "completed"
    # The edge the other way round (the failed node depends on the new one) is none either.
    decision = decide(facts(nodes, [edge("check", "sample"), edge("resample", "sample")]))
    assert decision.task_status != "completed"


def test_a_retry_that_failed_in_turn_is_released_by_its_own_completed_retry() -> None:
    nodes = [
        CHECK,
        FAILED_SAMPLE,
        node("resample", "failed", "human"),
        node("resample-2", "completed", "human"),
    ]
    chain = [edge("check", "sample"), edge("sample", "resample"), edge("resample", "resample-2")]
    assert decide(facts(nodes, chain)).task_status == "completed"
    assert unretried(nodes, chain) == []
    broken = chain[:-1]
    assert unretried(nodes, broken) == ["sample", "resample"]


def test_one_rule_for_agent_nodes() -> None:
    failed = node("query", "failed")
    retried = [failed, node("query-2", "completed")]
    assert decide(facts(retried, [edge("query", "query-2")])).task_status == "completed"
    # A person's step is no retry of the agent's own node: the agent skips its node instead.
    by_person = [failed, node("reading", "completed", "human")]
    assert decide(facts(by_person, [edge("query", "reading")])).task_status != "completed"
    skipped = [node("query", "skipped"), node("reading", "completed", "human")]
    assert decide(facts(skipped, [edge("query", "reading")])).task_status == "completed"


@pytest.mark.parametrize("report", ["continue", "waiting", None])
def test_a_retry_completes_nothing_without_a_completed_report(report: str | None) -> None:
    nodes = [CHECK, FAILED_SAMPLE, node("resample", "completed", "human")]
    decision = decide(facts(nodes, [edge("sample", "resample")], report=report))
    assert decision.task_status != "completed"


def test_the_round_limit_names_the_failed_node_without_a_retry() -> None:
    decision = decide(facts([CHECK, FAILED_SAMPLE], [], rounds_done=4, max_rounds=5))
    assert (decision.task_status, decision.failure_code) == ("failed", "round_limit")
    assert "sample" in decision.reason


def test_the_reason_names_every_failed_node_without_a_retry_and_only_those() -> None:
    nodes = [
        FAILED_SAMPLE,
        node("resample", "completed", "human"),
        node("callback", "failed", "human"),
        node("query", "failed"),
    ]
    decision = decide(facts(nodes, [edge("sample", "resample")], report="waiting"))
    assert decision.queues_next
    assert unretried(nodes, [edge("sample", "resample")]) == ["callback", "query"]
    assert "callback (human), query (agent)" in decision.reason
    assert "sample (" not in decision.reason


def test_without_edges_a_failed_node_still_holds_the_task() -> None:
    # The facts of a caller that passes no edges: no retry can be shown.
    nodes = [CHECK, FAILED_SAMPLE, node("resample", "completed", "human")]
    decision = decide(RoundFacts(nodes, "completed", 0, 0, 5))
    assert decision.task_status != "completed"


def test_the_agent_cannot_mark_a_person_failed_node_skipped_or_cancelled() -> None:
    before = [dict(FAILED_SAMPLE, reason="failed by lab at 2026-12-04T01:02:03+00:00")]
    for status in ("skipped", "cancelled", "completed"):
        after = [dict(before[0], status=status)]
        codes = [p["code"] for p in authority_problems(after, before)]
        assert "human_node" in codes, status


def test_the_agent_cannot_complete_the_human_retry_itself() -> None:
    before = [FAILED_SAMPLE]
    after = [FAILED_SAMPLE, node("resample", "completed", "human")]
    codes = [p["code"] for p in authority_problems(after, before)]
    assert codes == ["human_node"]
    # Adding it open is what the agent does; a person closes it.
    assert authority_problems([FAILED_SAMPLE, node("resample", "pending", "human")], before) == []


def test_the_refusals_tell_the_agent_how_to_retry() -> None:
    before = [dict(FAILED_SAMPLE, reason="failed by lab")]
    (refusal,) = authority_problems([dict(before[0], status="skipped")], before)
    assert "new human node with an edge from it" in refusal["message"]
    with pytest.raises(ValidationFailed) as caught:
        validate_plan(
            {"request_id": "r", "title": "t", "nodes": [node("q", "running")], "edges": []},
            [{"id": "q", "status": "failed", "actor": "agent"}],
        )
    (reopened,) = [d for d in caught.value.details if d["code"] == "failed_node_reopened"]
    assert "same actor with an edge from the failed one" in reopened["message"]


def test_a_cycle_of_failed_nodes_releases_nothing_and_ends() -> None:
    # A stored plan has no cycle (validation refuses one); the rule still never loops on one.
    nodes = [node("a", "failed", "human"), node("b", "failed", "human")]
    assert unretried(nodes, [edge("a", "b"), edge("b", "a")]) == ["a", "b"]


def test_a_node_closed_before_its_edge_was_drawn_is_no_retry() -> None:
    """A retry is a new node: a new edge into a node already completed (or failed) would make
    it a retry of a step it never followed, so the publish is refused (`retry_not_new`)."""
    callback = node("callback", "completed", "human")
    before = [CHECK, FAILED_SAMPLE, callback]
    drawn = [edge("check", "sample"), edge("check", "callback")]
    redrawn = [*drawn, edge("sample", "callback")]
    (refusal,) = retry_edge_problems(before, redrawn, before, drawn)
    assert (refusal["code"], refusal["node_id"]) == ("retry_not_new", "callback")
    # Drawn while the step was still open (the person's node pending, the edge already there),
    # the same edge is no new edge when the step later closes.
    assert retry_edge_problems(before, redrawn, before, redrawn) == []
    # ... nor before the failed step failed: it would have released it the moment it failed.
    pending = [CHECK, node("sample", "pending", "human"), callback]
    assert [p["code"] for p in retry_edge_problems(pending, redrawn, pending, drawn)] == [
        "retry_not_new"
    ]
    # Into a failed node that has a completed retry of its own: the same.
    chain = [CHECK, FAILED_SAMPLE, node("other", "failed", "human")]
    assert retry_edge_problems(chain, [edge("sample", "other")], chain, [])
    # An edge from another actor's node releases nothing, and a new node is no closed one.
    assert retry_edge_problems(before, [edge("check", "callback")], before, []) == []
    resample = [*before, node("resample", "pending", "human")]
    assert retry_edge_problems(resample, [edge("sample", "resample")], before, drawn) == []


def test_a_failed_step_is_retried_only_by_a_node_new_with_its_edge() -> None:
    """Seed 004 (重试使用新节点): a new edge from a failed node into a node that was already
    in the plan, even an open one, is refused: a person completing that other step (a
    call-back planned for its own reason) would otherwise release the failed sampling."""
    callback = node("callback", "pending", "human")
    before = [CHECK, FAILED_SAMPLE, callback]
    drawn = [edge("check", "sample"), edge("check", "callback")]
    (refusal,) = retry_edge_problems(before, [*drawn, edge("sample", "callback")], before, drawn)
    assert (refusal["code"], refusal["node_id"]) == ("retry_not_new", "callback")
    # A new node with its edge is the retry, and an edge drawn before the step failed stays.
    resample = [*before, node("resample", "pending", "human")]
    assert retry_edge_problems(resample, [*drawn, edge("sample", "resample")], before, drawn) == []
    assert (
        retry_edge_problems(
            before,
            [*drawn, edge("sample", "callback")],
            before,
            [*drawn, edge("sample", "callback")],
        )
        == []
    )


def test_a_failure_the_agent_has_not_answered_gets_it_a_round_though_a_step_is_open() -> None:
    callback = node("callback", "waiting", "human")
    nodes, edges = [CHECK, FAILED_SAMPLE, callback], [edge("check", "sample")]
    unseen = RoundFacts(nodes, "waiting", 0, 0, 5, plan_edges=edges, person_revised_last=True)
    decision = decide(unseen)
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert "after the agent's last plan: sample" in decision.reason
    # Seen and kept without a retry (the agent published since, or the next generation kept
    # the step a person failed in the earlier plan): still news, not a wait for the call-back.
    kept = decide(RoundFacts(nodes, "waiting", 0, 0, 5, plan_edges=edges))
    assert (kept.task_status, kept.outcome) == ("queued", "continue")
    assert "with no retry in the agent's plan: sample" in kept.reason
    assert "edge from the failed node" in kept.reason  # how to answer it
    # A retry already drawn is the agent's answer: the task waits for the people.
    retried = [*nodes, node("resample", "pending", "human")]
    for revised_by_person in (True, False):
        answered = RoundFacts(
            retried,
            "waiting",
            0,
            0,
            5,
            plan_edges=[*edges, edge("sample", "resample")],
            person_revised_last=revised_by_person,
        )
        assert decide(answered).task_status == "waiting"
    # A pending action still holds the task: its approval belongs to this generation.
    held = RoundFacts(nodes, "waiting", 1, 0, 5, plan_edges=edges)
    assert decide(held).task_status == "waiting"
    # The round limit bounds an agent that never answers: the task fails, saying why.
    last = RoundFacts(nodes, "waiting", 0, 4, 5, plan_edges=edges)
    limited = decide(last)
    assert (limited.task_status, limited.failure_code) == ("failed", "round_limit")
    assert "sample (human)" in limited.reason


def test_what_answers_a_failed_human_step() -> None:
    failed = [CHECK, FAILED_SAMPLE]
    to_retry = [edge("check", "sample"), edge("sample", "retry")]
    assert unanswered(failed, [edge("check", "sample")]) == ["sample"]
    # A human retry open or completed answers it; an agent node "retrying" it does not.
    for status in ("pending", "running", "waiting", "completed"):
        retry = node("retry", status, "human")
        assert unanswered([*failed, retry], to_retry) == []
    assert unanswered([*failed, node("retry", "pending")], to_retry) == ["sample"]
    # A retry a person failed or skipped, with nothing after it, answers nothing: both are news.
    assert unanswered([*failed, node("retry", "failed", "human")], to_retry) == [
        "sample",
        "retry",
    ]
    assert unanswered([*failed, node("retry", "skipped", "human")], to_retry) == ["sample"]
    # ... and a retry of the failed retry answers both.
    chain = [*failed, node("retry", "failed", "human"), node("retry-2", "pending", "human")]
    assert unanswered(chain, [*to_retry, edge("retry", "retry-2")]) == []
    # The agent's own failed node is not a person's news (it may skip or cancel it itself).
    assert unanswered([CHECK, node("query", "failed")], []) == []
    # A stored cycle (no valid plan has one) ends the walk rather than loop.
    loop = [node("a", "failed", "human"), node("b", "failed", "human")]
    assert unanswered(loop, [edge("a", "b"), edge("b", "a")]) == ["a", "b"]
