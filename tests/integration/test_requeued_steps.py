"""A task that failed with a human step open, requeued by an operator: a person closes the step
in the failed generation's plan (the new generation has none yet). What the new generation's
agent is shown of that plan, and what the plan's streams do."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.domain.fences import Fence
from orchestrator.runtime import Runtime
from orchestrator.services.task_stream import TaskStreamService
from orchestrator.tools.tasks import ReadTaskContext
from tests.executions_support import claim_as_worker, fenced_ctx, node, plan_call
from tests.openai_server import OpenAIServer, call
from tests.transcript_support import openai_runtime, trigger

NODES = [node("check", "pending"), node("callback", "waiting", actor="human")]


@dataclass(frozen=True)
class Requeued:
    rt: Runtime
    task_id: str
    first_session: str  # generation 1's: it holds the task's latest plan


@pytest.fixture
def failed(store_url: str, scripts: Path, server: OpenAIServer) -> Iterator[Requeued]:
    """Generation 1 published a plan with the call-back open, then its model call failed (a
    400): the task failed, and the round saved its recovery snapshot with revision 1."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(tool_calls=[call("c2", **_publish())])
        server.fail(400, message="bad request")
        task_id = trigger(rt)
        rt.executions.run(task_id, 1, worker="w1")
        task = rt.tasks.get(task_id)
        assert (task.status, task.failure_code) == ("failed", "model_error")
        assert task.session_id is not None
        yield Requeued(rt, task_id, task.session_id)
    finally:
        rt.close()


def _publish() -> dict[str, Any]:
    body = plan_call("c2", "r1", NODES)
    return {"name": body["name"], "arguments": body["arguments"]}


def _statuses(plan: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["status"] for n in plan["nodes"]}


def test_the_recovery_shows_the_plan_with_the_step_a_person_closed_after_the_round(
    failed: Requeued,
) -> None:
    """The snapshot kept the plan as the round left it (the call-back open) and was shown as
    such beside `previous_generation.plan`, which had the person's step: two plans, the stale
    one in `recovery`, which the agent reads first."""
    rt, task_id = failed.rt, failed.task_id
    assert rt.tasks.explain(task_id)["recovery"]["last_plan"]["revision"] == 1
    rt.tasks.requeue(task_id, "model fixed")
    step = rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert (step.plan.session_id, step.plan.revision, step.generation) == (
        failed.first_session,
        2,
        2,
    )
    # Generation 2's agent reads the snapshot first: its plan is the one with the step.
    fence = Fence(task_id, 2, claim_as_worker(rt, task_id, 2, "w1", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    context = ReadTaskContext(rt.db).run(fenced_ctx(fence, session_id), None)
    assert context.status == "succeeded", context
    recovery = context.payload["recovery"]
    assert recovery["generation"] == 1
    assert (recovery["last_plan"]["session_id"], recovery["last_plan"]["revision"]) == (
        failed.first_session,
        2,
    )
    assert _statuses(recovery["last_plan"]) == {"check": "pending", "callback": "completed"}
    assert recovery["last_plan"] == context.payload["previous_generation"]["plan"]
    # The operator's view of the snapshot says the same.
    shown = rt.tasks.explain(task_id)["recovery"]["last_plan"]
    assert (shown["revision"], _statuses(shown)["callback"]) == (2, "completed")


def test_a_requeue_reopens_the_stream_of_the_failed_task_s_last_plan(failed: Requeued) -> None:
    """The documented behaviour (the README's HTTP API table, the plan stream, and "A requeue of
    a finished task" in docs/business-backend.md): a final task's last session
    is finished, so a reconnect that saw its newest revision is a 204; a requeue makes that
    session take a person's steps again until the new generation publishes, and a new
    connection follows it again. The client learns of the requeue as it learns of any, from
    `GET /api/v1/tasks/{id}` or by opening the task stream again, which shows the step."""
    rt, task_id, first = failed.rt, failed.task_id, failed.first_session
    path = f"/api/v1/agent/chat/session/{first}/stream"
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        before = client.get(path, headers={"Last-Event-ID": "1"})
        assert before.status_code == 204, before.text
        rt.tasks.requeue(task_id, "model fixed")
        assert rt.plans.takes_writes(first)
        with client.stream("GET", path, headers={"Last-Event-ID": "1"}) as again:
            assert again.status_code == 200
            assert next(again.iter_lines()) == "event: state"
    step = rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert (step.plan.session_id, step.plan.revision) == (first, 2)
    # The task stream, opened again after the requeue, shows that plan and relays the step.
    stream = TaskStreamService(rt.db)
    snapshot = stream.snapshot(task_id)
    assert (snapshot.data["status"], snapshot.data["plan"]["session_id"]) == ("queued", first)
    (last,) = stream.events_after(task_id, snapshot.last_seq - 1)
    assert last.name == "execution_plan"
    assert (last.data["plan"]["session_id"], last.data["plan"]["revision"]) == (first, 2)
    # Nothing is open in it any more: the session is finished again.
    assert rt.plans.state(first).finished
