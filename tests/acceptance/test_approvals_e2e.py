"""Approvals end to end: a real worker runs the task, an operator decides through the CLI, and
the decision moves the task into its next generation at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import (
    kept_node,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    wait_for,
)

pytestmark = pytest.mark.slow

READ = {"tool_calls": [{"id": "c0", "name": "read_task_context", "arguments": {}}, query_call()]}
PROPOSE = {
    "id": "c2",
    "name": "propose_action",
    "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "north"}},
}
WAITING = [
    READ,
    {
        "tool_calls": [
            plan_call("c1", "r1", [node("check", "completed"), node("repair", "waiting")])
        ]
    },
    {"tool_calls": [PROPOSE]},
    {"tool_calls": [report_call("c3", "waiting")]},
]
COMPLETING = [
    READ,
    {
        "tool_calls": [
            plan_call(
                "c1",
                "r1",
                # Generation 2 keeps the checked node as it was and the repair's action id.
                [
                    kept_node(0),
                    node("repair", "completed", evidence="ok")
                    | {"action_id": "${c0.result.previous_generation.plan.nodes.1.action_id}"},
                ],
                edges=[{"from": "check", "to": "repair"}],
            )
        ]
    },
    {"tool_calls": [report_call("c2", "completed")]},
]


def write(scripts: Path, turns: list[dict[str, Any]]) -> None:
    scripts.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"turns": turns, "record_requests": True})
    (scripts / "wo.json").write_text(body, encoding="utf-8")


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_MAX_ROUNDS": "2",
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.fixture
def rt(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    yield runtime
    runtime.close()


def waiting_task(fleet: Fleet, rt: Runtime, scripts: Path) -> tuple[str, str, str]:
    write(scripts, WAITING)
    worker = fleet.worker(concurrency=1)
    wait_for(lambda: fleet.ready(worker), 30, what="the worker")
    made = fleet.cli("tasks", "trigger", "--type", "wo", "--title", "Low pressure", "--json")
    assert made.returncode == 0, made.stderr
    task_id = json.loads(made.stdout)["task_id"]
    wait_for(lambda: rt.tasks.get(task_id).status == "waiting", 30, what="waiting")
    listed = fleet.cli("actions", "list", "--task", task_id, "--json")
    (action,) = json.loads(listed.stdout)
    shown = fleet.cli("actions", "show", action["action_id"])
    assert shown.returncode == 0, shown.stderr
    assert '"crew": "north"' in shown.stdout
    digest = json.loads(fleet.cli("actions", "show", action["action_id"], "--json").stdout)[
        "digest"
    ]
    assert f"digest {digest}" in shown.stdout
    return task_id, action["action_id"], digest


def context_of_last_round(scripts: Path) -> dict[str, Any]:
    lines = (scripts / "wo.json.requests.jsonl").read_text(encoding="utf-8").splitlines()
    for message in json.loads(lines[-1])["messages"]:
        if message["role"] == "tool" and message["tool_call_id"] == "c0":
            return dict(json.loads(message["content"])["result"])
    raise AssertionError("no read_task_context result recorded")


def test_an_approval_through_the_cli_moves_the_task_to_completion(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    task_id, action_id, digest = waiting_task(fleet, rt, scripts)
    stale = fleet.cli("actions", "approve", action_id, "--digest", "f" * 64, "--by", "ana")
    assert stale.returncode == 1
    assert "stale_approval" in stale.stderr
    missing = fleet.cli("actions", "approve", action_id, "--by", "ana")
    assert missing.returncode == 2  # --digest is required to approve
    write(scripts, COMPLETING)
    approved = fleet.cli(
        "actions", "approve", action_id, "--digest", digest, "--by", "ana", "--note", "go"
    )
    assert approved.returncode == 0, approved.stderr
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    task = rt.tasks.get(task_id)
    assert (task.generation, task.intent_round) == (2, 1)
    (seen,) = context_of_last_round(scripts)["actions"]
    assert (seen["action_id"], seen["status"], seen["approver"], seen["note"]) == (
        action_id,
        "approved",
        "ana",
        "go",
    )


def test_a_rejection_is_seen_and_not_proposed_again(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    task_id, action_id, _ = waiting_task(fleet, rt, scripts)
    rejected = fleet.cli("actions", "reject", action_id, "--by", "ben", "--note", "wrong valve")
    assert rejected.returncode == 0, rejected.stderr
    # Generation 2 plays the same script, re-proposing the same work order: it gets the
    # rejected action back, nothing new waits, and the round limit (2) ends the task.
    wait_for(lambda: rt.tasks.get(task_id).status == "failed", 30, what="the next generation")
    assert rt.tasks.get(task_id).generation == 2
    actions = rt.actions.list(task_id=task_id, status=None)
    assert [(a.action_id, a.status) for a in actions] == [(action_id, "rejected")]
    (seen,) = context_of_last_round(scripts)["actions"]
    assert (seen["status"], seen["approver"], seen["note"]) == ("rejected", "ben", "wrong valve")
