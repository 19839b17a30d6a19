"""Reading a plan an older version stored in another shape is widened; writing one is not."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.api.plan_views import plan_as_sent
from orchestrator.domain.plans import status_counts, validate_plan
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
        "updated_at": datetime(2026, 12, 1, tzinfo=UTC).isoformat(),
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
