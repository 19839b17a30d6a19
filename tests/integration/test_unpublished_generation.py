"""A generation that publishes no plan of its own goes by the task's latest plan, over a real
store: after a requeue or a crash an agent that finds the plan as it should be may only report.
Read as its own (none), its `waiting` round saw nothing awaited and continued round after round
to `round_limit`, while a person's step was still open."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.executions_support import node, plan_call, query_call, report_call
from tests.executions_support import runtime_for as build

READ = {"tool_calls": [{"id": "c0", "name": "read_task_context", "arguments": {}}, query_call()]}


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, RecordingDispatcher, Path]]:
    runtime, dispatcher = build(store_url, tmp_path / "scripts")
    yield runtime, dispatcher, tmp_path / "scripts"
    runtime.close()


def script(scripts: Path, turns: list[dict[str, Any]]) -> None:
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "plain.json").write_text(json.dumps({"turns": turns}), encoding="utf-8")


def ended(rt: Runtime, task_id: str, generation: int) -> tuple[str | None, str]:
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    assert execution is not None
    return execution.outcome, execution.reason or ""


def test_a_round_that_only_reports_waits_for_the_person_step_of_the_task_s_plan(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, dispatcher, scripts = env
    nodes = [node("check", "completed"), node("sample", "waiting", actor="human")]
    script(scripts, [READ, {"tool_calls": [plan_call("c1", "r1", nodes)]}, REPORT_WAITING])
    task_id = rt.tasks.trigger(Trigger(task_type="plain", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"

    # An operator looks again; the agent finds the plan as it should be and only reports.
    rt.tasks.requeue(task_id, reason="look again")
    script(scripts, [READ, REPORT_WAITING])
    assert rt.executions.run(task_id, 2, worker="w").outcome == "waiting"
    assert ended(rt, task_id, 2) == ("waiting", "human node(s) not completed: sample")
    assert rt.tasks.get(task_id).status == "waiting"

    # The person's step (into generation 1's plan) is then what the task waited for.
    rt.human_steps.close(task_id, "sample", "completed", by="lab", evidence="chlorine 0.4 mg/L")
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation, dispatcher.sent[-1]) == ("queued", 3, (task_id, 3))


def test_a_round_that_only_reports_completes_on_the_task_s_plan_all_done(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _dispatcher, scripts = env
    nodes = [node("check", "completed"), node("conclude", "completed")]
    # Generation 1 publishes a plan all done, then its round ends without a report.
    script(scripts, [READ, {"tool_calls": [plan_call("c1", "r1", nodes)]}, {"content": "?"}])
    task_id = rt.tasks.trigger(Trigger(task_type="plain", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "continue"

    script(scripts, [READ, {"tool_calls": [report_call("c2", "completed")]}, {"content": "ok"}])
    assert rt.executions.run(task_id, 2, worker="w").outcome == "completed"
    assert rt.tasks.get(task_id).status == "completed"


REPORT_WAITING = {"tool_calls": [report_call("c2", "waiting")]}
