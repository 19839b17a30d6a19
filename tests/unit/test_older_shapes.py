"""Reading a plan an older version stored in another shape is widened; writing one is not."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.api.plan_views import plan_as_sent
from orchestrator.domain.plans import status_counts, validate_plan
from orchestrator.domain.times import wire_time
from orchestrator.errors import ValidationFailed

NO_ACTOR = {"id": "b", "title": "Step b", "status": "pending"}  # before nodes had an actor


def revision(nodes: Any, edges: Any) -> dict[str, Any]:
    return {
        "schema_version": "execution-plan@1",
        "session_id": "s",
        "revision": 1,
        "request_id": "r",
        "title": "t",
        "reason": "",
        "nodes": nodes,
        "edges": edges,
        "status_counts": status_counts(nodes if isinstance(nodes, list) else [nodes]),
        "task_id": None,
        "generation": None,
        "updated_at": wire_time(datetime(2026, 12, 1, tzinfo=UTC)),
    }


def test_a_new_plan_with_a_node_of_the_older_shape_is_still_refused() -> None:
    plan = {"request_id": "r", "title": "t", "reason": "", "nodes": [NO_ACTOR], "edges": []}
    with pytest.raises(ValidationFailed) as refused:
        validate_plan(plan)
    assert "invalid_actor" in {d["code"] for d in refused.value.details}


def test_a_column_holding_one_node_instead_of_a_list_is_one_item_of_text() -> None:
    sent = plan_as_sent(revision(NO_ACTOR, {"from": "a", "to": "b", "label": None}))
    assert sent["nodes"] == [json.dumps(NO_ACTOR, sort_keys=True)]
    assert sent["edges"] == [{"from": "a", "to": "b", "label": None}]


def test_a_plan_of_today_is_sent_as_it_is() -> None:
    node = {**NO_ACTOR, "actor": "human", "description": "", "evidence": "", "reason": None}
    stored = revision([node], [])
    assert plan_as_sent(stored) == stored  # no key added, none dropped


def test_status_counts_skip_what_they_cannot_read() -> None:
    counts = status_counts([7, "x", {"status": ["pending"]}, {"status": "pending"}, None])
    assert counts["pending"] == 1
    assert sum(counts.values()) == 1


def test_a_stored_node_with_an_id_but_no_readable_status_is_still_kept_and_open() -> None:
    # Seed 004 (更新必须保留原节点): every node of the previous revision with an id is kept, its
    # status readable or not. Before, a node whose status was null, absent or of another type
    # was left out of the rules: an agent could drop an open human node, and the end of a round
    # could complete a task whose plan still held it.
    from orchestrator.domain.decisions import RoundFacts, decide
    from orchestrator.domain.plans import check_update, readable_nodes

    done = {"id": "a", "title": "a", "actor": "agent", "evidence": "x", "status": "completed"}
    sample = {"id": "k", "title": "sample", "actor": "human", "status": None}
    retest = {"id": "m", "title": "retest", "actor": "human"}
    odd = {"id": "n", "title": "call", "actor": "agent", "status": ["pending"]}
    previous = readable_nodes([done, sample, retest, odd])
    assert previous is not None
    assert [node["id"] for node in previous] == ["a", "k", "m", "n"]
    problems = check_update([done], previous)
    assert [(p["code"], p["node_id"]) for p in problems] == [
        ("node_removed", "k"),
        ("node_removed", "m"),
        ("node_removed", "n"),
    ]
    decision = decide(
        RoundFacts(
            plan_nodes=previous,
            report_outcome="completed",
            pending_actions=0,
            rounds_done=0,
            max_rounds=5,
        )
    )
    assert (decision.task_status, decision.reason) == (
        "waiting",
        "human node(s) not completed: k, m",
    )
    agent_only = readable_nodes([done, odd])
    decision = decide(
        RoundFacts(
            plan_nodes=agent_only,
            report_outcome="completed",
            pending_actions=0,
            rounds_done=0,
            max_rounds=5,
        )
    )
    assert decision.task_status != "completed", decision
