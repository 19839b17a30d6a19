"""Real workers on `ORCH_MODEL=openai:…` against the loopback OpenAI-compatible server.

A task completes end to end, its transcript and token usage readable from the CLI; a worker
SIGKILLed in the middle of a write leaves the call `unknown`, and the next generation's context
says so before that generation runs anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import node, plan_call, query_call, report_call, wait_for
from tests.openai_server import OpenAIServer, Reply, call

KEY = "sk-fleet-secret"


@pytest.fixture
def fleet(pg_url: str, redis_url: str, tmp_path: Path, server: OpenAIServer) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": "openai:test-model",
        "LLM_BASE_URL": server.base_url,
        "LLM_API_KEY": KEY,
        "LLM_MAX_RETRIES": "2",
        "ORCH_ENABLE_COMMAND_TOOL": "true",
        "ORCH_LEASE_SECONDS": "3",
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": "1",
        "ORCH_QUEUED_STALE_SECONDS": "3",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


def as_call(raw: dict[str, Any]) -> dict[str, Any]:
    return call(raw["id"], raw["name"], raw["arguments"])


@pytest.mark.slow
def test_a_task_on_the_openai_model_completes_through_a_real_worker(
    fleet: Fleet, rt: Runtime, server: OpenAIServer
) -> None:
    server.reply(
        tool_calls=[call("c1", "read_task_context", {}), as_call(query_call())], usage=(200, 5)
    )
    server.fail(429, retry_after=0.2)
    server.reply(
        tool_calls=[as_call(plan_call("c2", "r1", [node("a", "completed", evidence="e")]))],
        usage=(300, 20),
    )
    server.reply(tool_calls=[as_call(report_call("c3", "completed"))], usage=(400, 15))
    server.reply(content="done", usage=(450, 1))
    fleet.worker(concurrency=1)
    task_id = rt.tasks.trigger(Trigger(task_type="water", title="Turbid")).task.task_id
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 40, what="completion")

    shown = fleet.cli("tasks", "show", task_id)
    assert shown.returncode == 0, shown.stderr
    assert "tokens (prompt+completion): 1350+41 in 4 model calls" in shown.stdout
    transcript = fleet.cli("tasks", "transcript", task_id, "--json")
    assert transcript.returncode == 0, transcript.stderr
    entries = json.loads(transcript.stdout)["items"]
    assert [e["kind"] for e in entries].count("model_turn") == 4
    text = fleet.cli("tasks", "transcript", task_id, "--generation", "1")
    assert "-> c2 publish_execution_plan" in text.stdout
    assert "<- c3 save_report: succeeded" in text.stdout
    assert KEY not in fleet.logs() + shown.stdout + transcript.stdout


@pytest.mark.slow
def test_after_a_sigkill_mid_write_the_next_generation_sees_the_call_unknown_first(
    fleet: Fleet, rt: Runtime, server: OpenAIServer
) -> None:
    server.reply(tool_calls=[call("c1", "read_task_context", {})])
    server.reply(tool_calls=[call("c2", "execute_command", {"command": "sleep 60"})])
    seen: list[dict[str, Any]] = []

    def first_turn_of_generation_two(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return Reply(tool_calls=[call("d1", "read_task_context", {})])

    def after_the_context(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return Reply(tool_calls=[as_call(report_call("d2", "failed"))])

    server.dynamic(first_turn_of_generation_two)
    server.dynamic(after_the_context)
    doomed = fleet.worker(concurrency=1)
    fleet.sweeper()
    task_id = rt.tasks.trigger(Trigger(task_type="water", title="Kill me")).task.task_id
    # The command's model turn is durable before the command runs: wait for it, then kill.
    wait_for(lambda: len(rt.tasks.transcript(task_id)["items"]) >= 3, 30, what="the command turn")
    Fleet.kill(doomed)
    fleet.worker(concurrency=1)
    wait_for(lambda: len(seen) >= 2, 40, what="generation 2's first two model calls")

    # Generation 2 ran only read_task_context before the model saw the recovery snapshot.
    history = seen[1]["messages"]
    called = [c["function"]["name"] for m in history for c in m.get("tool_calls") or []]
    assert called == ["read_task_context"]
    context = json.loads(history[-1]["content"])["result"]
    assert next(iter(context)) == "recovery"
    recovery = context["recovery"]
    assert recovery["generation"] == 1
    assert [(c["call_id"], c["tool"], c["status"]) for c in recovery["unknown"]] == [
        ("c2", "execute_command", "unknown")
    ]
    assert [c["call_id"] for c in recovery["done"]] == ["c1"]
    assert "read-only" in recovery["verify_first"]
    wait_for(lambda: rt.tasks.get(task_id).status == "failed", 30, what="the failed report")
