"""A human step a person failed, over a real store: it holds the task's completion until a
human retry (a new node with an edge from it) is completed by a person; the agent alone cannot
release it, and the decision's reason tells the next round what to do."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store.task_events import events_after
from orchestrator.tools.plans import PublishExecutionPlan
from tests.executions_support import (
    READ_AND_QUERY,
    approve_the_action,
    execution_end,
    kept_node,
    last_queued_reason,
    node,
    plan_call,
    report_call,
    write_script,
)
from tests.executions_support import runtime_for as build

CHECK_TO_SAMPLE = {"from": "check", "to": "sample"}


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, RecordingDispatcher, Path]]:
    runtime, dispatcher = build(store_url, tmp_path / "scripts")
    yield runtime, dispatcher, tmp_path / "scripts"
    runtime.close()


def script(scripts: Path, turns: list[dict[str, Any]]) -> None:
    write_script(scripts, "retry", turns, record_requests=True)


def last_request(scripts: Path) -> list[dict[str, Any]]:
    """The messages of the last request the model was sent."""
    lines = (scripts / "retry.json.requests.jsonl").read_text(encoding="utf-8").splitlines()
    messages: list[dict[str, Any]] = json.loads(lines[-1])["messages"]
    return messages


def last_context(scripts: Path) -> dict[str, Any]:
    """What `read_task_context` returned to the model in the last request it was sent."""
    result: dict[str, Any] = next(
        json.loads(m["content"])["result"]
        for m in last_request(scripts)
        if m["role"] == "tool" and m["tool_call_id"] == "c0"
    )
    return result


def waiting_on(rt: Runtime, scripts: Path, *humans: str, approval: bool = False) -> str:
    """A task whose generation 1 ended waiting on the human nodes `humans` (and an action)."""
    nodes = [node("check", "completed")]
    nodes += [node(h, "waiting", actor="human") for h in humans]
    edges = [{"from": "check", "to": h} for h in humans]
    propose: list[dict[str, Any]] = []
    if approval:
        nodes.append(node("repair", "waiting"))
        propose.append(
            {
                "id": "a1",
                "name": "propose_action",
                "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "n"}},
            }
        )
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", nodes, edges=edges)]},
            # Its own turn: the calls of one turn may run at once, and an action's node must
            # be in a saved plan first.
            *([{"tool_calls": propose}] if propose else []),
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="retry", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    return task_id


def test_a_failed_human_step_completes_only_through_a_persons_retry(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, dispatcher, scripts = env
    task_id = waiting_on(rt, scripts, "sample")

    # A person fails the sampling: the waiting task goes on at once, so the agent can react.
    step = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)

    # Generation 2 (dishonest): marks the person's failed node skipped (refused), then keeps
    # it and declares the task completed anyway.
    skipped = node("sample", "skipped", actor="human")
    skipped["reason"] = "not needed after all"
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [kept_node(0), skipped], [CHECK_TO_SAMPLE])]},
            {
                "tool_calls": [
                    plan_call("c2", "r2", [kept_node(0), kept_node(1)], [CHECK_TO_SAMPLE])
                ]
            },
            {"tool_calls": [report_call("c3", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    outcome, reason = execution_end(rt, task_id, 2)
    assert outcome == "continue"
    assert "failed node(s) with no completed retry: sample (human)" in reason
    with rt.db.transaction(readonly=True) as conn:
        gen2 = execution_store.get_execution(conn, task_id, 2)
    assert gen2 is not None
    plan = rt.plans.latest(gen2.session_id)
    assert plan is not None
    assert plan.revision == 1  # the skipped one was refused, nothing written
    assert {n["id"]: n["status"] for n in plan.nodes}["sample"] == "failed"

    # Generation 3 (dishonest): "retries" the sampling with an agent node it completes.
    by_agent = node("resample", "completed")
    script(
        scripts,
        [
            READ_AND_QUERY,
            {
                "tool_calls": [
                    plan_call(
                        "c1",
                        "r1",
                        [kept_node(0), kept_node(1), by_agent],
                        [CHECK_TO_SAMPLE, {"from": "sample", "to": "resample"}],
                    )
                ]
            },
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 3, worker="w").outcome == "continue"
    # The round read why generation 2 did not complete, and how to go on.
    seen = last_context(scripts)["previous_generation"]
    assert "sample (human)" in seen["reason"]
    assert "edge from the failed node" in seen["reason"]
    # ... and the system prompt says how a retry is made, as the publish tool's text does.
    (system,) = [m["content"] for m in last_request(scripts) if m["role"] == "system"]
    assert "edge from the failed node" in system
    assert "edge from the failed node" in PublishExecutionPlan.description
    outcome, reason = execution_end(rt, task_id, 3)
    assert "sample (human)" in reason
    assert rt.tasks.get(task_id).status == "queued"

    # Generation 4 (honest): a human retry depending on the failed node, then waits for it.
    resample = node("resample-2", "pending", actor="human")
    kept = [kept_node(i) for i in range(3)]
    edges = [
        CHECK_TO_SAMPLE,
        {"from": "sample", "to": "resample"},
        {"from": "sample", "to": "resample-2"},
    ]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [*kept, resample], edges)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    assert rt.executions.run(task_id, 4, worker="w").outcome == "waiting"
    assert "resample-2" in execution_end(rt, task_id, 4)[1]

    # A person takes the new sample; generation 5 reports completed with evidence.
    done = rt.human_steps.close(
        task_id, "resample-2", "completed", by="lab", evidence="chlorine 0.4 mg/L at tap 3"
    )
    assert (done.task_status, done.generation) == ("queued", 5)
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [kept_node(i) for i in range(4)], edges)]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 5, worker="w").outcome == "completed"
    task = rt.tasks.get(task_id)
    assert task.status == "completed"


def test_a_failed_step_wakes_the_agent_while_another_human_step_is_open(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The agent can plan the retry now instead of after the call-back, which may take days."""
    rt, dispatcher, scripts = env
    task_id = waiting_on(rt, scripts, "sample", "callback")
    step = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)
    with rt.db.transaction(readonly=True) as conn:
        queued = [e for e in events_after(conn, task_id, 0, 50) if e.type == "queued"]
    assert queued[-1].reason is not None
    assert "human node sample failed" in queued[-1].reason
    # A completion or a skip is no news the agent must act on: the task waits for the rest.
    other = waiting_on(rt, scripts, "sample", "callback")
    for node_id, status in (("sample", "completed"), ("callback", "skipped")):
        kept = rt.human_steps.close(
            other, node_id, status, by="lab", evidence="ok", reason="no answer"
        )
        if node_id == "sample":
            assert (kept.task_status, kept.generation) == ("waiting", 1)
    assert rt.tasks.get(other).status == "queued"
    # A pending approval still holds the task: it belongs to the waiting generation.
    held = waiting_on(rt, scripts, "sample", approval=True)
    step = rt.human_steps.close(held, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation) == ("waiting", 1)


def test_a_step_a_person_closed_before_is_no_retry_of_a_failed_one(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The dishonest agent draws an edge from the person's failed step to another human step
    a person had completed already (the call-back): that step was done before the sampling
    failed, so it retries nothing. The publish is refused and the task does not complete."""
    rt, _dispatcher, scripts = env
    task_id = waiting_on(rt, scripts, "sample", "callback")
    rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="water is clear")
    step = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation) == ("queued", 2)
    edges = [CHECK_TO_SAMPLE, {"from": "check", "to": "callback"}]
    redrawn = [*edges, {"from": "sample", "to": "callback"}]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [kept_node(i) for i in range(3)], redrawn)]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    assert rt.tasks.get(task_id).status == "queued"
    refusals = [
        e["body"]
        for e in rt.tasks.transcript(task_id, 2)["items"]
        if e["kind"] == "tool_result" and e.get("call_id") == "c1"
    ]
    assert [r.get("code") for r in refusals] == ["retry_not_new"]
    with rt.db.transaction(readonly=True) as conn:
        gen2 = execution_store.get_execution(conn, task_id, 2)
    assert gen2 is not None
    assert rt.plans.latest(gen2.session_id) is None  # the redrawn plan was refused


def test_a_step_failed_while_the_round_runs_wakes_the_agent_after_it(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The running round never saw the failure (it came after the agent's last plan): its
    end queues the next round for the agent to react, though another human step is open."""
    rt, dispatcher, scripts = env
    humans = [node(h, "waiting", actor="human") for h in ("sample", "callback")]
    edges = [{"from": "check", "to": h} for h in ("sample", "callback")]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [node("check", "completed"), *humans], edges)]},
            {"delay_s": 1.5, "tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="retry", title="Turbid water")).task.task_id
    outcome: list[str] = []
    runner = threading.Thread(
        target=lambda: outcome.append(rt.executions.run(task_id, 1, worker="w").outcome)
    )
    runner.start()
    deadline = time.monotonic() + 10
    while rt.tasks.explain(task_id)["plan"] is None:
        assert time.monotonic() < deadline, "the round never published its plan"
        time.sleep(0.05)
    step = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation) == ("running", 1)  # the round decides
    runner.join(15)
    assert outcome == ["continue"]
    ended_as, reason = execution_end(rt, task_id, 1)
    assert ended_as == "continue"
    assert "failed node(s) with no completed retry: sample (human)" in reason
    assert dispatcher.sent[-1] == (task_id, 2)
    # Seen and answered with nothing (the agent published again, no retry): still news, so
    # the retry does not wait for the call-back; the round limit bounds an agent that never
    # answers (`test_an_agent_that_never_answers_a_failure_runs_out_of_rounds`).
    kept = [kept_node(0), kept_node(1), humans[1]]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", kept, edges)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    assert "with no retry in the agent's plan: sample" in execution_end(rt, task_id, 2)[1]
    assert dispatcher.sent[-1] == (task_id, 3)


def four_steps(rt: Runtime, scripts: Path) -> str:
    """A task whose generation 1 waits on a re-test, a sampling and a call-back; a person
    failed the re-test (generation 2 is queued, no plan of its own), then the sampling while
    generation 2 was still queued (into generation 1's plan)."""
    task_id = waiting_on(rt, scripts, "retest", "sample", "callback")
    retest = rt.human_steps.close(task_id, "retest", "failed", by="lab", reason="meter broke")
    assert (retest.task_status, retest.generation) == ("queued", 2)
    step = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (step.task_status, step.generation, step.plan.generation) == ("queued", 2, 1)
    return task_id


FOUR_EDGES = [{"from": "check", "to": h} for h in ("retest", "sample", "callback")]


def test_a_step_failed_before_the_next_generation_publishes_is_news_at_its_round_end(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Generation 2's first publish kept the sampling failed (invariant 22) and retried only
    the re-test; the call-back was open. The agent had published last, so its round ended
    `waiting` for the call-back (days), and the failed sampling's retry waited with it."""
    rt, dispatcher, scripts = env
    task_id = four_steps(rt, scripts)
    retest_2 = node("retest-2", "pending", actor="human")
    edges = [*FOUR_EDGES, {"from": "retest", "to": "retest-2"}]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [*map(kept_node, range(4)), retest_2], edges)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    outcome, reason = execution_end(rt, task_id, 2)
    assert outcome == "continue"
    assert "with no retry in the agent's plan: sample" in reason
    assert "retest" not in reason.split("plan: ")[1].split(";")[0]  # answered: not named
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("queued", 3)
    assert dispatcher.sent[-1] == (task_id, 3)

    # Answered (a human retry drawn from the sampling): the task waits for its people.
    sample_2 = node("sample-2", "pending", actor="human")
    script(
        scripts,
        [
            READ_AND_QUERY,
            {
                "tool_calls": [
                    plan_call(
                        "c1",
                        "r1",
                        [*map(kept_node, range(5)), sample_2],
                        [*edges, {"from": "sample", "to": "sample-2"}],
                    )
                ]
            },
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    assert rt.executions.run(task_id, 3, worker="w").outcome == "waiting"
    assert execution_end(rt, task_id, 3)[1] == (
        "human node(s) not completed: callback, retest-2, sample-2"
    )
    assert rt.tasks.get(task_id).status == "waiting"


def test_an_agent_that_never_answers_a_failure_runs_out_of_rounds(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Each round that keeps the failure without a retry queues the next, up to the round
    limit (rounds count across the generations of an intent); then the task fails, saying
    which step has no retry and how to make one."""
    rt, _dispatcher, scripts = env
    task_id = waiting_on(rt, scripts, "sample", "callback")
    rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    edges = [{"from": "check", "to": h} for h in ("sample", "callback")]
    script(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [*map(kept_node, range(3))], edges)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    limit = rt.settings.max_rounds
    outcomes = [rt.executions.run(task_id, g, worker="w").outcome for g in range(2, limit + 1)]
    assert outcomes == ["continue"] * (limit - 2) + ["failed"]
    task = rt.tasks.get(task_id)
    assert (task.status, task.failure_code) == ("failed", "round_limit")
    assert "sample (human)" in (task.last_error or "")


def test_an_approval_releases_a_task_held_with_an_unanswered_failure(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """The pending action held the task when a person failed the sampling; its approval
    re-decided the task as `waiting` for the call-back, and the failure waited with it."""
    rt, dispatcher, scripts = env
    task_id = waiting_on(rt, scripts, "sample", "callback", approval=True)
    held = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="bottle broke")
    assert (held.task_status, held.generation) == ("waiting", 1)
    approve_the_action(rt, task_id)
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)
    assert "human node(s) sample failed with no retry in the plan" in last_queued_reason(
        rt, task_id
    )
