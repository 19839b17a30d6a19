"""A retry is a new node (seed 004: 重试使用新节点), over a real store: the host keeps which node
retries which failed node with each revision (`plan_revisions.retries`), so a step planned after
a human step before it failed (`sample -> retest`) never counts as its retry, across the
generations of a task; a revision stored before the relation was kept keeps its meaning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import null, text, update

from orchestrator.api.plan_views import PlanRevisionView
from orchestrator.domain.decisions import unanswered_failed_human_nodes, unretried_failed_nodes
from orchestrator.domain.fences import Fence
from orchestrator.domain.retries import retries_of
from orchestrator.errors import ValidationFailed
from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import reports as report_store
from orchestrator.store.tables import plan_revisions
from orchestrator.store.task_plans import task_latest_plan
from tests.executions_support import (
    READ_AND_QUERY,
    approve_the_action,
    claim_as_worker,
    execution_end,
    kept_node,
    last_queued_reason,
    node,
    plan_call,
    report_call,
    write_script,
)
from tests.executions_support import runtime_for as build

SUCCESSION = [{"from": "check", "to": "sample"}, {"from": "sample", "to": "retest"}]


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, RecordingDispatcher, Path]]:
    runtime, dispatcher = build(store_url, tmp_path / "scripts")
    yield runtime, dispatcher, tmp_path / "scripts"
    runtime.close()


def script(scripts: Path, turns: list[dict[str, Any]]) -> None:
    write_script(scripts, "retry", turns)


def stored_retries(rt: Runtime, task_id: str) -> dict[str, list[str]] | None:
    """The relation kept with the task's latest revision."""
    with rt.db.transaction(readonly=True) as conn:
        plan = task_latest_plan(conn, task_id)
    assert plan is not None
    return plan.retries


def shown_retries(rt: Runtime, task_id: str) -> dict[str, list[str]]:
    """The relation the plan view shows (the API, the stream, the console, the agent's tool)."""
    with rt.db.transaction(readonly=True) as conn:
        plan = task_latest_plan(conn, task_id)
    assert plan is not None
    return PlanRevisionView.model_validate(plan.to_dict()).retries


def sampled_then_retested(rt: Runtime, scripts: Path, *, approval: bool = False) -> str:
    """Generation 1 plans `check -> sample (human) -> retest (human)` (and, with `approval`, a
    `callback` step and a repair awaiting approval) and ends waiting; a person fails the
    sampling (the bottle broke), then completes the re-test, which never repeated it."""
    nodes = [node("check", "completed"), node("sample", "waiting", actor="human")]
    nodes.append(node("retest", "waiting", actor="human"))
    edges = list(SUCCESSION)
    turns: list[dict[str, Any]] = [READ_AND_QUERY]
    if approval:
        nodes += [node("callback", "waiting", actor="human"), node("repair", "waiting")]
        edges.append({"from": "check", "to": "callback"})
    turns.append({"tool_calls": [plan_call("c1", "r1", nodes, edges=edges)]})
    if approval:
        propose = {"node_id": "repair", "kind": "work_order", "payload": {"crew": "n"}}
        turns.append({"tool_calls": [{"id": "a1", "name": "propose_action", "arguments": propose}]})
    turns.append({"tool_calls": [report_call("c2", "waiting")]})
    script(scripts, turns)
    task_id = rt.tasks.trigger(Trigger(task_type="retry", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    assert stored_retries(rt, task_id) == {}
    rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    rt.human_steps.close(task_id, "retest", "completed", by="lab", evidence="turbidity 0.3 NTU")
    # The person's steps drew no retry: the re-test followed the sampling before it failed.
    assert shown_retries(rt, task_id) == {}
    assert stored_retries(rt, task_id) == {}
    return task_id


def test_a_step_planned_after_a_failed_one_is_no_retry_but_a_new_one_is(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, dispatcher, scripts = env
    task_id = sampled_then_retested(rt, scripts)
    assert (rt.tasks.get(task_id).status, dispatcher.sent[-1]) == ("queued", (task_id, 2))

    # Generation 2 keeps the plan and reports completed: the sampling was never repeated.
    kept = [kept_node(i) for i in range(3)]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", kept, SUCCESSION)]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    outcome, reason = execution_end(rt, task_id, 2)
    assert outcome == "continue"
    # The failure is unanswered (the round end queues the agent) and unretried.
    assert "human node(s) a person failed, with no retry in the agent's plan: sample" in reason
    assert "failed node(s) with no completed retry: sample (human)" in reason
    assert "a node already in the plan when it failed is no retry" in reason
    assert (rt.tasks.get(task_id).status, dispatcher.sent[-1]) == ("queued", (task_id, 3))

    # Generation 3 draws a new human node from the sampling: the task waits for it.
    sample_2 = node("sample-2", "pending", actor="human")
    retried = [*SUCCESSION, {"from": "sample", "to": "sample-2"}]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [*kept, sample_2], retried)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    assert rt.executions.run(task_id, 3, worker="w").outcome == "waiting"
    assert execution_end(rt, task_id, 3)[1] == "human node(s) not completed: sample-2"
    assert stored_retries(rt, task_id) == {"sample": ["sample-2"]}
    assert shown_retries(rt, task_id) == {"sample": ["sample-2"]}

    # A person takes the sample again; generation 4's first publish carries the relation on
    # from generation 3's plan (invariant 22), and the task completes.
    step = rt.human_steps.close(
        task_id, "sample-2", "completed", by="lab", evidence="chlorine 0.4 mg/L at tap 3"
    )
    assert (step.task_status, step.generation) == ("queued", 4)
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [kept_node(i) for i in range(4)], retried)]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 4, worker="w").outcome == "completed"
    assert rt.tasks.get(task_id).status == "completed"
    with rt.db.transaction(readonly=True) as conn:
        gen4 = execution_store.get_execution(conn, task_id, 4)
        assert gen4 is not None
        facts = report_store.generation_facts(conn, task_id, 4, gen4.session_id)
    assert facts.plan_retries == {"sample": ["sample-2"]}


def test_an_approval_does_not_let_a_step_planned_after_a_failed_one_hold_the_failure(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The repair's approval re-decides the task (`services.redecide`, the rule the round end
    applies): the failed sampling is news, though the call-back is open and the re-test after
    the sampling was completed."""
    rt, dispatcher, scripts = env
    task_id = sampled_then_retested(rt, scripts, approval=True)
    assert rt.tasks.get(task_id).status == "waiting"  # the pending repair held it
    approve_the_action(rt, task_id)
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)
    assert "human node(s) sample failed with no retry in the plan" in last_queued_reason(
        rt, task_id
    )


def test_an_agent_failing_its_node_and_drawing_the_new_one_in_one_publish_retries_it(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _dispatcher, scripts = env
    query = node("query", "failed")
    query["reason"] = "the source timed out"
    edges = [{"from": "check", "to": "query"}, {"from": "query", "to": "query-2"}]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {
                "tool_calls": [
                    plan_call("c1", "r1", [node("check", "completed"), node("query", "running")])
                ]
            },
            {
                "tool_calls": [
                    plan_call(
                        "c2",
                        "r2",
                        [node("check", "completed"), query, node("query-2", "completed")],
                        edges,
                    )
                ]
            },
            {"tool_calls": [report_call("c3", "completed")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="retry", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
    assert stored_retries(rt, task_id) == {"query": ["query-2"]}


def test_a_revision_stored_before_the_relation_was_kept_keeps_its_meaning(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Rows of before the migration (NULL) are read by their edges, as they were: there the
    re-test after the failed sampling released it, and the next revision starts from that."""
    rt, _dispatcher, scripts = env
    task_id = sampled_then_retested(rt, scripts)
    with rt.db.transaction() as conn:
        cleared = conn.execute(
            update(plan_revisions).where(plan_revisions.c.task_id == task_id).values(retries=null())
        )
        assert cleared.rowcount == 3
        assert (
            conn.execute(
                text("SELECT count(*) FROM plan_revisions WHERE task_id = :t AND retries IS NULL"),
                {"t": task_id},
            ).scalar_one()
            == 3
        )
    assert stored_retries(rt, task_id) is None
    assert shown_retries(rt, task_id) == {"sample": ["retest"]}  # what the rules read
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [kept_node(i) for i in range(3)], SUCCESSION)]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "completed"
    assert stored_retries(rt, task_id) == {"sample": ["retest"]}


def running_with_a_sample(rt: Runtime) -> tuple[str, str, Fence, dict[str, Any]]:
    """Generation 1 claimed and its first plan published: `check` running, `sample` (human)
    waiting. The task, its session, the fence, and the plan body as the agent holds it."""
    task_id = rt.tasks.trigger(Trigger(task_type="retry", title="Turbid water")).task.task_id
    fence = Fence(task_id, 1, claim_as_worker(rt, task_id, 1, "w", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    body = {
        "request_id": "r1",
        "title": "Investigation",
        "reason": "first plan",
        "nodes": [
            node("check", "running"),
            node("sample", "waiting", actor="human"),
        ],
        "edges": [{"from": "check", "to": "sample"}],
    }
    rt.plans.publish_execution_plan(session_id, body, fence=fence)
    return task_id, session_id, fence, body


def test_a_step_drawn_after_a_human_step_the_agent_still_saw_open_is_no_retry(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The agent read the plan with the sampling open and draws the re-test after it; a person
    fails the sampling before that publish commits. The host keeps the failure in the agent's
    revision (`keep_person_closed`), but the re-test was drawn as a succession, not as a retry
    of a failure the agent never saw: a person completing it never repeated the sampling.
    It counted as the retry (`next_retries` read the failure the host put back)."""
    rt, _dispatcher, _scripts = env
    task_id, session_id, fence, body = running_with_a_sample(rt)
    rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    stale = {
        **body,
        "request_id": "r2",
        "reason": "a re-test after the sampling",
        "nodes": [*body["nodes"], node("retest", "pending", actor="human")],
        "edges": [*body["edges"], {"from": "sample", "to": "retest"}],
    }
    published = rt.plans.publish_execution_plan(session_id, stale, fence=fence).plan
    assert {n["id"]: n["status"] for n in published.nodes}["sample"] == "failed"
    assert published.retries == {}
    assert PlanRevisionView.model_validate(published.to_dict()).retries == {}
    with rt.db.transaction(readonly=True) as conn:
        facts = report_store.generation_facts(conn, task_id, 1, session_id)
    relation = retries_of(facts.plan_nodes, facts.plan_edges, facts.plan_retries)
    assert unanswered_failed_human_nodes(facts.plan_nodes, relation) == ["sample"]

    # Seeing the failure, the agent draws a new sampling from it: that one is the retry.
    answered = {
        **stale,
        "request_id": "r3",
        "reason": "the sampling again",
        "nodes": [*published.nodes, node("sample-2", "pending", actor="human")],
        "edges": [*stale["edges"], {"from": "sample", "to": "sample-2"}],
    }
    again = rt.plans.publish_execution_plan(session_id, answered, fence=fence).plan
    assert again.retries == {"sample": ["sample-2"]}


def test_an_agent_cannot_pass_a_node_of_before_the_failure_off_as_its_retry(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The dishonest agent: a human step planned before the sampling failed is offered as its
    retry by dropping it and drawing it again, or by drawing an edge into it; each is refused,
    and a plan that keeps it as it was draws no retry."""
    rt, _dispatcher, _scripts = env
    task_id, session_id, fence, body = running_with_a_sample(rt)
    planned = {
        **body,
        "request_id": "r2",
        "nodes": [*body["nodes"], node("callback", "pending", actor="human")],
        "edges": [*body["edges"], {"from": "check", "to": "callback"}],
    }
    rt.plans.publish_execution_plan(session_id, planned, fence=fence)
    rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    seen = rt.plans.latest(session_id)
    assert seen is not None
    kept = [n for n in seen.nodes if n["id"] != "callback"]
    callback = next(n for n in seen.nodes if n["id"] == "callback")
    edges = [{"from": "check", "to": "sample"}]
    dropped = {**body, "request_id": "r3", "nodes": kept, "edges": edges}
    with pytest.raises(ValidationFailed) as refused:
        rt.plans.publish_execution_plan(session_id, dropped, fence=fence)
    assert "node_removed" in {p["code"] for p in refused.value.details}
    edge_into_it = {
        **body,
        "request_id": "r4",
        "nodes": [*kept, callback],
        "edges": [
            *edges,
            {"from": "check", "to": "callback"},
            {"from": "sample", "to": "callback"},
        ],
    }
    with pytest.raises(ValidationFailed) as refused:
        rt.plans.publish_execution_plan(session_id, edge_into_it, fence=fence)
    assert "retry_not_new" in {p["code"] for p in refused.value.details}
    rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert stored_retries(rt, task_id) == {}
    with rt.db.transaction(readonly=True) as conn:
        facts = report_store.generation_facts(conn, task_id, 1, session_id)
    relation = retries_of(facts.plan_nodes, facts.plan_edges, facts.plan_retries)
    assert unretried_failed_nodes(facts.plan_nodes, relation) == ["sample"]
