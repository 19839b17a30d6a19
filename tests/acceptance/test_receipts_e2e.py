"""Write receipts end to end: the scripted agent, the real loop and tools, a counting backend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet
from tests.executions_support import (
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    wait_for,
)
from tests.executions_support import write_script as write
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import task_receipt_statuses
from workers.celery_app import CeleryDispatcher, make_celery


def put(call_id: str, value: int = 5) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "call_api",
        "arguments": {
            "operation_id": "putSetting",
            "arguments": {"key": "pressure", "body": {"value": value}},
        },
    }


def order(call_id: str, quantity: int) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "call_api",
        "arguments": {
            "operation_id": "createOrder",
            "arguments": {"body": {"item": "valve", "quantity": quantity}},
        },
    }


FINISH = [
    {"tool_calls": [query_call()]},  # what the completed node and report cite
    {"tool_calls": [plan_call("p1", "r1", [node("a", "completed")])]},
    {"tool_calls": [report_call("rep", "completed")]},
]


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as running:
        yield running
        running.release.set()


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "backend.json"
    path.write_text(json.dumps(SPEC))
    return path


def test_identical_parallel_writes_run_once_and_failures_are_honest(
    pg_url: str, tmp_path: Path, backend: Backend, spec: Path
) -> None:
    scripts = tmp_path / "scripts"
    rt, _ = runtime_for(pg_url, scripts, gateway_spec=spec, gateway_base_url=backend.url)
    try:
        write(
            scripts,
            "gateway",
            [
                {"tool_calls": [put("c1"), put("c2"), put("c3")]},  # one intent, three calls
                {"tool_calls": [order("c4", 11)]},  # the backend answers 422
                *FINISH,
            ],
        )
        write(scripts, "dropped", [{"tool_calls": [order("c1", 2)]}, *FINISH])
        task_id = rt.tasks.trigger(Trigger(task_type="gateway", title="t")).task.task_id
        assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
        assert backend.count("PUT", "/settings/pressure") == 1
        assert task_receipt_statuses(rt.db, task_id) == ["succeeded", "failed"]

        backend.mode["/orders"] = "drop"  # applied, then the connection drops unanswered
        dropped = rt.tasks.trigger(Trigger(task_type="dropped", title="t")).task.task_id
        assert rt.executions.run(dropped, 1, worker="w").ran
        assert task_receipt_statuses(rt.db, dropped) == ["unknown"]
    finally:
        rt.close()


def test_a_worker_killed_mid_write_leaves_unknown_and_the_next_generation_verifies(
    pg_url: str, redis_url: str, tmp_path: Path, backend: Backend, spec: Path
) -> None:
    scripts = tmp_path / "scripts"
    write(scripts, "setting", [{"tool_calls": [put("c1", 7)]}, *FINISH])
    backend.mode["/settings/pressure"] = "hold"  # applies the write, never answers
    env = {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_REDIS_URL": redis_url,
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_LEASE_SECONDS": "3",
        "ORCH_LEASE_RENEW_SECONDS": "1",
        "ORCH_SWEEP_SECONDS": "1",
        "ORCH_GATEWAY_SPEC": str(spec),
        "ORCH_GATEWAY_BASE_URL": backend.url,
        "ORCH_GATEWAY_TIMEOUT_SECONDS": "60",
        "ORCH_HOME": str(tmp_path / "home"),
    }
    fleet = Fleet(env, tmp_path)
    rt, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    rt.dispatcher = CeleryDispatcher(make_celery(rt.settings))
    try:
        doomed = fleet.worker(concurrency=1)
        fleet.sweeper()
        task_id = rt.tasks.trigger(Trigger(task_type="setting", title="t")).task.task_id
        assert backend.held.wait(timeout=30), fleet.logs()
        assert task_receipt_statuses(rt.db, task_id) == ["running"]
        standby = fleet.worker(concurrency=1)
        wait_for(lambda: fleet.ready(standby), 30, what="the standby worker")
        Fleet.kill(doomed)  # the request was sent; its outcome was never recorded
        backend.mode["/settings/pressure"] = "ok"
        wait_for(lambda: rt.tasks.get(task_id).status == "completed", 30, what="completion")
        time.sleep(0.5)
        assert backend.count("PUT", "/settings/pressure") == 1, fleet.logs()
        assert backend.count("GET", "/settings/pressure") >= 1  # the read-only verification
        assert task_receipt_statuses(rt.db, task_id) == ["succeeded"]
        outcomes = [e["outcome"] for e in rt.tasks.explain(task_id)["executions"]]
        assert outcomes == ["lost", "completed"]
    finally:
        backend.release.set()
        fleet.stop()
        rt.close()
