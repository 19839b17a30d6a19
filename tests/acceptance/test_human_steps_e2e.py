"""A human node completed through a real API process resumes the task on a real worker."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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


def sample(status: str) -> dict[str, Any]:
    return node("sample", status, actor="human", evidence="0.4 mg/L at tap 3")


def write(
    scripts: Path, nodes: list[Any], outcome: str, edges: list[dict[str, str]] | None = None
) -> None:
    scripts.mkdir(parents=True, exist_ok=True)
    turns = [
        READ,
        {"tool_calls": [plan_call("c1", "r1", nodes, edges=edges)]},
        {"tool_calls": [report_call("c2", outcome)]},
    ]
    (scripts / "hs.json").write_text(json.dumps({"turns": turns}), encoding="utf-8")


@pytest.fixture
def fleet(pg_url: str, redis_url: str, scripts: Path, tmp_path: Path) -> Iterator[Fleet]:
    operators = tmp_path / "operators"
    digest = hashlib.sha256(b"lab-token").hexdigest()
    operators.write_text(f"lab operator {digest}\n", encoding="utf-8")
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_OPERATORS": str(operators),
    }
    with running_fleet(env, tmp_path) as running:
        yield running


@pytest.fixture
def rt(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    yield runtime
    runtime.close()


def test_a_sample_completed_through_the_api_resumes_the_task(
    fleet: Fleet, rt: Runtime, scripts: Path
) -> None:
    write(scripts, [node("check", "completed"), sample("waiting")], "waiting")
    worker = fleet.worker(concurrency=1)
    _, url = fleet.answering_api()
    wait_for(lambda: fleet.ready(worker), 30, what="the worker")
    headers = {"Authorization": "Bearer lab-token"}
    made = httpx.post(
        f"{url}/api/v1/tasks", json={"task_type": "hs", "title": "Turbid"}, headers=headers
    )
    assert made.status_code == 201, made.text
    task_id = made.json()["task_id"]
    wait_for(lambda: rt.tasks.get(task_id).status == "waiting", 30, what="waiting on the sample")

    # Generation 2 keeps both nodes as they are: the check it completed, the sample a person closed.
    write(
        scripts,
        [kept_node(0), kept_node(1)],
        "completed",
        edges=[{"from": "check", "to": "sample"}],
    )
    done = httpx.post(
        f"{url}/api/v1/tasks/{task_id}/nodes/sample/complete",
        json={"evidence": "0.4 mg/L at tap 3"},
        headers=headers,
        timeout=30,
    )
    assert done.status_code == 200, done.text
    assert (done.json()["by"], done.json()["task_status"]) == ("lab", "queued")
    wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
    assert rt.tasks.get(task_id).generation == 2
