"""Which node retries which failed node, kept with each revision (`domain.retries`).

A retry is a node new since the failure: an edge drawn before a node failed is a succession and
retries nothing (seed 004: 重试使用新节点), though a person later completes the node it leads to.
"""

from __future__ import annotations

from typing import Any

from orchestrator.domain.decisions import (
    RoundFacts,
    awaited_human_nodes,
    decide,
    unanswered_failed_human_nodes,
    unretried_failed_nodes,
)
from orchestrator.domain.retries import (
    next_retries,
    readable_retries,
    retries_by_edges,
    retries_of,
)


def node(node_id: str, status: str, actor: str = "human") -> dict[str, Any]:
    return {"id": node_id, "status": status, "actor": actor}


def edge(source: str, target: str) -> dict[str, Any]:
    return {"from": source, "to": target}


CHECK = node("check", "completed", "agent")
SUCCESSION = [edge("check", "sample"), edge("sample", "retest")]


def after(
    nodes: list[dict[str, Any]],
    edges: list[dict[str, Any]],
    previous: list[dict[str, Any]] | None,
    previous_edges: list[dict[str, Any]] | None = None,
    retries: dict[str, list[str]] | None = None,
) -> dict[str, list[str]]:
    return next_retries(
        nodes,
        edges,
        previous_nodes=previous,
        previous_edges=previous_edges,
        previous_retries=retries,
    )


def test_a_node_planned_after_one_before_it_failed_is_no_retry_of_it() -> None:
    drawn = [CHECK, node("sample", "waiting"), node("retest", "waiting")]
    assert after(drawn, SUCCESSION, None) == {}
    failed = [CHECK, node("sample", "failed"), node("retest", "waiting")]
    relation = after(failed, SUCCESSION, drawn, SUCCESSION, {})
    assert relation == {}
    # A person completes the re-test: the sampling is still not repeated, nor answered.
    done = [CHECK, node("sample", "failed"), node("retest", "completed")]
    relation = after(done, SUCCESSION, failed, SUCCESSION, relation)
    assert unretried_failed_nodes(done, relation) == ["sample"]
    assert unanswered_failed_human_nodes(done, relation) == ["sample"]
    decision = decide(RoundFacts(done, "completed", 0, 0, 5, plan_edges=SUCCESSION,
                                 plan_retries=relation))  # fmt: skip
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
    assert "with no retry in the agent's plan: sample" in decision.reason
    # The round's reason tells the agent the node it planned before is none: draw a new one.
    assert "a node already in the plan when it failed is no retry" in decision.reason
    assert "new node of the same actor and an edge from the failed node" in decision.reason


def test_a_new_node_drawn_from_the_failed_one_is_its_retry() -> None:
    failed = [CHECK, node("sample", "failed"), node("retest", "completed")]
    retried = [*failed, node("sample-2", "pending")]
    edges = [*SUCCESSION, edge("sample", "sample-2")]
    relation = after(retried, edges, failed, SUCCESSION, {})
    assert relation == {"sample": ["sample-2"]}
    assert unanswered_failed_human_nodes(retried, relation) == []  # answered: drawn
    assert unretried_failed_nodes(retried, relation) == ["sample"]  # not yet completed
    waiting = decide(RoundFacts(retried, "waiting", 0, 0, 5, plan_retries=relation))
    assert waiting.task_status == "waiting"
    assert "sample-2" in waiting.reason
    done = [*failed, node("sample-2", "completed")]
    # A person's step adds no node: the relation goes on as it was.
    assert after(done, edges, retried, edges, relation) == relation
    assert decide(RoundFacts(done, "completed", 0, 0, 5, plan_retries=relation)).task_status == (
        "completed"
    )


def test_failing_a_node_and_drawing_its_retry_in_one_publish_is_a_retry() -> None:
    before = [CHECK, node("query", "running", "agent")]
    now = [CHECK, node("query", "failed", "agent"), node("query-2", "completed", "agent")]
    edges = [edge("check", "query"), edge("query", "query-2")]
    relation = after(now, edges, before, [edge("check", "query")], {})
    assert relation == {"query": ["query-2"]}
    assert decide(RoundFacts(now, "completed", 0, 0, 5, plan_retries=relation)).task_status == (
        "completed"
    )
    # The first revision of all: every node is new, so the same holds.
    assert after(now, edges, None) == {"query": ["query-2"]}


def test_only_a_node_of_the_failed_nodes_actor_retries_it() -> None:
    failed = [CHECK, node("sample", "failed")]
    by_agent = [*failed, node("resample", "completed", "agent")]
    assert after(by_agent, [edge("sample", "resample")], failed, [], {}) == {}
    # ... and an edge into the failed node, not from it, retries nothing either.
    by_person = [*failed, node("resample", "pending")]
    assert after(by_person, [edge("resample", "sample")], failed, [], {}) == {}


def test_the_relation_is_carried_forward_and_a_retry_of_a_retry_is_kept() -> None:
    failed = [CHECK, node("sample", "failed"), node("sample-2", "failed")]
    relation = {"sample": ["sample-2"]}
    chain = [*failed, node("sample-3", "completed")]
    # The later publish leaves the first edge out: what was drawn as a retry stays one.
    edges = [edge("sample-2", "sample-3")]
    carried = after(chain, edges, failed, [edge("sample", "sample-2")], relation)
    assert carried == {"sample": ["sample-2"], "sample-2": ["sample-3"]}
    assert unretried_failed_nodes(chain, carried) == []
    assert relation == {"sample": ["sample-2"]}  # the previous revision's is not changed


def test_a_revision_stored_without_the_relation_keeps_its_meaning() -> None:
    """Rows from before the relation was kept (NULL) are read by their edges, as then; the
    next revision starts from that reading, and a failure after it follows the new rule."""
    legacy = [CHECK, node("sample", "failed"), node("retest", "completed"),
              node("callback", "waiting")]  # fmt: skip
    edges = [*SUCCESSION, edge("check", "callback"), edge("callback", "recall")]
    assert retries_of(legacy, edges, None) == {"sample": ["retest"]}
    assert decide(
        RoundFacts(legacy[:3], "completed", 0, 0, 5, plan_edges=SUCCESSION)
    ).task_status == ("completed")
    now = [*legacy[:3], node("callback", "failed"), node("recall", "waiting")]
    # `recall` was drawn (from the still open call-back) in the row of before: no retry.
    prior = [*legacy, node("recall", "pending")]
    assert after(now, edges, prior, edges, None) == {"sample": ["retest"]}
    assert retries_of(legacy, edges, {}) == {}  # a stored relation is what counts


def test_awaited_human_nodes_is_the_rule_both_deciders_share() -> None:
    open_step = node("callback", "waiting")
    nodes = [CHECK, node("sample", "failed"), open_step, node("retest", "completed")]
    assert awaited_human_nodes(nodes, {}) == []  # the failure is news: nothing is awaited
    assert awaited_human_nodes(nodes, retries_by_edges(nodes, SUCCESSION)) == ["callback"]
    with_retry = [*nodes, node("sample-2", "pending")]
    assert awaited_human_nodes(with_retry, {"sample": ["sample-2"]}) == ["callback", "sample-2"]


def test_a_stored_relation_of_another_shape_shows_no_retry() -> None:
    assert readable_retries(None) is None
    assert readable_retries(["sample", "sample-2"]) == {}
    assert readable_retries({"sample": ["sample-2", 3], "x": "y", "z": None}) == {
        "sample": ["sample-2"]
    }
