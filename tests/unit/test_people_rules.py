"""Pure rules of people in the loop: action digests, plan binding, human nodes a person closes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.domain.approvals import action_digest, still_bound
from orchestrator.domain.human_steps import close_human_node, keep_person_closed
from orchestrator.errors import ConflictError, NotFound

AT = datetime(2026, 12, 4, 1, 2, 3, tzinfo=UTC)


def node(node_id: str, status: str, actor: str = "human", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "title": node_id, "actor": actor, "status": status, **extra}


def test_the_digest_is_of_the_canonical_kind_and_payload() -> None:
    assert action_digest("work_order", {"a": 1, "b": [1, 2]}) == action_digest(
        "work_order", {"b": [1, 2], "a": 1}
    )
    assert action_digest("work_order", {"a": 1}) != action_digest("command", {"a": 1})
    assert action_digest("work_order", {"a": 1}) != action_digest("work_order", {"a": 2})


@pytest.mark.parametrize(
    ("nodes", "bound"),
    [
        ([node("n", "waiting", "agent", action_id="x")], True),
        # Completed while the action waits: done without it (only a person can, on a human
        # node; the agent completes an action's node after its approval).
        ([node("n", "completed", action_id="x")], False),
        ([node("n", "completed", "agent", action_id="x")], False),
        ([node("n", "running", action_id="x")], True),
        ([node("n", "cancelled", "agent", action_id="x")], False),
        ([node("n", "skipped", "agent", action_id="x")], False),
        ([node("n", "failed", "agent", action_id="x")], False),  # a retry is a new node
        ([node("n", "waiting", "agent", action_id="y")], False),
        ([node("m", "waiting", "agent", action_id="x")], False),
        (None, False),
    ],
)
def test_an_action_stays_bound_while_its_node_serves_it(
    nodes: list[dict[str, Any]] | None, bound: bool
) -> None:
    assert still_bound("x", "n", nodes) is bound


def test_a_person_closes_only_an_open_human_node_and_is_recorded() -> None:
    nodes = [node("a", "running", "agent"), node("h", "waiting", reason="sample due")]
    done = close_human_node(nodes, "h", "completed", by="lab", at=AT, evidence="0.4 mg/L")
    assert done[1]["status"] == "completed"
    assert done[1]["evidence"] == "0.4 mg/L"
    assert done[1]["reason"] == "completed by lab at 2026-12-04T01:02:03+00:00"
    assert done[0] == nodes[0]
    failed = close_human_node(nodes, "h", "failed", by="lab", at=AT, reason="no access")
    assert failed[1]["reason"].startswith("no access (failed by lab at")
    with pytest.raises(ConflictError, match="agent node"):
        close_human_node(nodes, "a", "completed", by="x", at=AT, evidence="e")
    with pytest.raises(NotFound):
        close_human_node(nodes, "zz", "skipped", by="x", at=AT, reason="r")
    # A second person acting on the same step learns who closed it, and when.
    with pytest.raises(ConflictError, match=r"already completed \(completed by lab at 2026-12-04T"):
        close_human_node(done, "h", "skipped", by="x", at=AT, reason="r")
    with pytest.raises(ConflictError, match=r"already failed: no access \(failed by lab at"):
        close_human_node(failed, "h", "completed", by="x", at=AT, evidence="e")


def test_a_step_the_agent_cancelled_is_not_said_closed_by_whom_its_reason_names() -> None:
    # Only the agent cancels a human node, and it writes the reason: text shaped like a
    # person's stamp must not make the refusal say that person closed the step.
    forged = "cancelled by lab at 2026-12-04T01:02:03+00:00"
    nodes = [node("h", "cancelled", reason=forged)]
    with pytest.raises(ConflictError) as refused:
        close_human_node(nodes, "h", "completed", by="x", at=AT, evidence="e")
    assert refused.value.code == "node_closed"
    assert str(refused.value) == (
        f"node 'h' is already cancelled, by the agent (its reason: {forged})"
    )


def test_an_agent_publish_keeps_what_a_person_closed_meanwhile() -> None:
    previous = [node("a", "running", "agent"), node("h", "completed", evidence="ok")]
    agent = [node("a", "completed", "agent", evidence="e"), node("h", "waiting", reason="due")]
    kept = keep_person_closed(agent, previous)
    assert kept[0] == agent[0]
    assert kept[1] == previous[1]
    # An agent node, or a human node the person left open, is the agent's to report.
    assert keep_person_closed(agent, [node("h", "waiting")]) == agent
