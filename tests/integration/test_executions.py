"""The execution service in-process over a real store: claims, fencing, decisions, caps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.executions import RunResult
from orchestrator.services.plans import PlanService
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.executions_support import (
    completing_turns,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    wait_for,
    write_script,
)


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, RecordingDispatcher]]:
    rt, dispatcher = runtime_for(store_url, scripts)
    yield rt, dispatcher
    rt.close()


def trigger(rt: Runtime, task_type: str, trigger_id: str | None = None) -> str:
    result = rt.tasks.trigger(
        Trigger(task_type=task_type, title="Low pressure", trigger_id=trigger_id)
    )
    return result.task.task_id


def run(rt: Runtime, task_id: str, generation: int, worker: str = "w1") -> RunResult:
    return rt.executions.run(task_id, generation, worker=worker)


def test_a_completing_round_completes_the_task(env: Any, scripts: Path) -> None:
    rt, dispatcher = env
    write_script(scripts, "simple", completing_turns())
    task_id = trigger(rt, "simple")
    assert dispatcher.sent == [(task_id, 1)]
    result = run(rt, task_id, 1)
    assert (result.ran, result.outcome) == (True, "completed")
    view = rt.tasks.explain(task_id)
    assert view["status"] == "completed"
    assert view["plan"]["revision"] == 2
    assert view["plan"]["status_counts"]["completed"] == 2
    assert view["report"]["outcome"] == "completed"
    assert [e["outcome"] for e in view["executions"]] == ["completed"]


def test_duplicate_trigger_id_returns_the_same_task_without_a_second_wakeup(env: Any) -> None:
    rt, dispatcher = env
    first = rt.tasks.trigger(Trigger(task_type="simple", title="t", trigger_id="same"))
    again = rt.tasks.trigger(Trigger(task_type="simple", title="t", trigger_id="same"))
    assert (first.created, again.created) == (True, False)
    assert again.task.task_id == first.task.task_id
    assert len(dispatcher.sent) == 1
    assert len(rt.tasks.explain(first.task.task_id)["executions"]) == 1


def test_a_delivery_for_another_generation_starts_no_agent(env: Any, scripts: Path) -> None:
    rt, _ = env
    write_script(scripts, "simple", completing_turns())
    task_id = trigger(rt, "simple")
    assert not run(rt, task_id, 2).ran  # not yet queued
    assert run(rt, task_id, 1).ran
    assert not run(rt, task_id, 1).ran  # late redelivery after it finished


def test_the_same_message_delivered_twice_at_once_starts_one_agent(env: Any, scripts: Path) -> None:
    rt, _ = env
    write_script(scripts, "slow", completing_turns(delay_s=1.0))
    task_id = trigger(rt, "slow")
    results: list[RunResult] = []
    threads = [
        threading.Thread(target=lambda w=w: results.append(run(rt, task_id, 1, worker=w)))
        for w in ("w1", "w2", "w3")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(r.ran for r in results) == [False, False, True]
    assert rt.tasks.get(task_id).status == "completed"


def test_no_report_means_continue_and_the_round_cap_fails_the_task(
    store_url: str, scripts: Path
) -> None:
    rt, dispatcher = runtime_for(store_url, scripts, max_rounds=3)
    try:
        write_script(
            scripts,
            "endless",
            [{"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]}, {"content": "hmm"}],
        )
        task_id = trigger(rt, "endless")
        outcomes = []
        for generation in (1, 2, 3):
            outcomes.append(run(rt, task_id, generation).outcome)
        assert outcomes == ["continue", "continue", "failed"]
        task = rt.tasks.get(task_id)
        assert (task.status, task.failure_code, task.generation) == ("failed", "round_limit", 3)
        assert dispatcher.sent[1:] == [(task_id, 2), (task_id, 3)]
    finally:
        rt.close()


def test_human_node_waits(env: Any, scripts: Path) -> None:
    rt, _ = env
    write_script(
        scripts,
        "sampling",
        [
            {"tool_calls": [query_call()]},
            {
                "tool_calls": [
                    plan_call(
                        "c1", "r1", [node("a", "completed"), node("s", "pending", actor="human")]
                    )
                ]
            },
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    task_id = trigger(rt, "sampling")
    assert run(rt, task_id, 1).outcome == "waiting"
    assert rt.tasks.get(task_id).status == "waiting"


def test_a_malformed_script_fails_the_round_with_a_clear_error(env: Any, scripts: Path) -> None:
    rt, dispatcher = env
    write_script(scripts, "broken", [{"tool_calls": [{"id": "x", "name": "launch_missiles"}]}])
    task_id = trigger(rt, "broken")
    result = run(rt, task_id, 1)
    assert result.outcome == "failed"
    view = rt.tasks.explain(task_id)
    assert view["status"] == "failed"
    assert view["failure_code"] == "model_error"
    assert "launch_missiles" in view["executions"][0]["reason"]
    assert dispatcher.sent == [(task_id, 1)]  # no crash loop: nothing requeued


def _running_fence(rt: Runtime, task_id: str, generation: int) -> Fence:
    def lookup() -> Fence | None:
        with rt.db.transaction(readonly=True) as conn:
            execution = execution_store.get_execution(conn, task_id, generation)
        if execution is None or execution.lease_token is None:
            return None
        return Fence(task_id, generation, execution.lease_token)

    fence: Fence = wait_for(lookup, timeout=10, what="the generation to start")
    return fence


def _late_plan_write(plans: PlanService, rt: Runtime, fence: Fence) -> None:
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, fence.task_id, fence.generation)
    assert execution is not None
    payload = plan_call("late", "late", [node("z", "running")])["arguments"]
    plans.publish_execution_plan(execution.session_id, payload, fence=fence)


def test_requeue_while_running_fences_the_old_generation(env: Any, scripts: Path) -> None:
    rt, dispatcher = env
    write_script(scripts, "slow", completing_turns(delay_s=2.0))
    task_id = trigger(rt, "slow")
    results: list[RunResult] = []
    worker = threading.Thread(target=lambda: results.append(run(rt, task_id, 1)))
    worker.start()
    old = _running_fence(rt, task_id, 1)
    task = rt.tasks.requeue(task_id, "operator wants a fresh look")
    assert task.generation == 2
    worker.join(timeout=30)
    assert results[0].outcome is None  # stopped without deciding anything
    with pytest.raises(StaleGeneration):
        _late_plan_write(rt.plans, rt, old)
    view = rt.tasks.explain(task_id)
    assert [e["outcome"] for e in view["executions"]] == ["superseded", None]
    assert view["status"] == "queued"
    assert dispatcher.sent[-1] == (task_id, 2)
    assert run(rt, task_id, 2).outcome == "completed"


def test_cancel_fences_the_live_generation(env: Any, scripts: Path) -> None:
    rt, _ = env
    write_script(scripts, "slow", completing_turns(delay_s=2.0))
    task_id = trigger(rt, "slow")
    worker = threading.Thread(target=lambda: run(rt, task_id, 1))
    worker.start()
    old = _running_fence(rt, task_id, 1)
    assert rt.tasks.cancel(task_id).status == "cancelled"
    worker.join(timeout=30)
    with pytest.raises(StaleGeneration):
        _late_plan_write(rt.plans, rt, old)
    view = rt.tasks.explain(task_id)
    assert view["status"] == "cancelled"
    assert view["executions"][0]["outcome"] == "cancelled"
    assert view["report"] is None


def test_a_requeue_answers_what_it_did_even_if_a_cancel_commits_right_after_it(
    env: Any, scripts: Path
) -> None:
    rt, dispatcher = env
    task_id = trigger(rt, "anything")
    sent = dispatcher.dispatch

    def cancel_then_send(task: str, generation: int) -> None:
        # Between the requeue's commit and its answer, an operator's cancel commits.
        if generation == 2:
            rt.tasks.cancel(task, "changed my mind")
        sent(task, generation)

    dispatcher.dispatch = cancel_then_send  # type: ignore[method-assign]
    requeued = rt.tasks.requeue(task_id, "try again")
    assert (requeued.status, requeued.generation) == ("queued", 2)
    assert rt.tasks.get(task_id).status == "cancelled"  # the cancel did happen, after it
