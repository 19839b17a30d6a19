"""A finished write is not repeated by the generations that recovery or continuation start;
an operator's requeue is a new request and may repeat it (seed 000)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.executions_support import node, plan_call, report_call, runtime_for, write_script
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import task_receipt_statuses


def order(call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "call_api",
        "arguments": {
            "operation_id": "createOrder",
            "arguments": {"body": {"item": "valve", "quantity": 2}},
        },
    }


# Orders a valve, leaves its node open and reports `continue`: the next generation is queued.
CONTINUING = [
    {"tool_calls": [plan_call("p1", "r1", [node("a", "running")])]},
    {"tool_calls": [order("o1")]},
    {"tool_calls": [report_call("rep", "continue")]},
    {"content": "more next round"},
]


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as running:
        yield running
        running.release.set()


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Backend) -> Iterator[Runtime]:
    spec = tmp_path / "backend.json"
    spec.write_text(json.dumps(SPEC))
    scripts = tmp_path / "scripts"
    write_script(scripts, "ordering", CONTINUING)
    runtime, _ = runtime_for(
        store_url, scripts, gateway_spec=spec, gateway_base_url=backend.url, max_rounds=10
    )
    yield runtime
    runtime.close()


def test_continued_and_recovered_generations_do_not_repeat_a_finished_write(
    rt: Runtime, backend: Backend
) -> None:
    task_id = rt.tasks.trigger(Trigger(task_type="ordering", title="t")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "continue"
    assert backend.count("POST", "/orders") == 1
    # Generation 2 (continuation) asks for the identical order: the receipt of generation 1
    # answers, nothing is sent.
    assert rt.executions.run(task_id, 2, worker="w").outcome == "continue"
    assert backend.count("POST", "/orders") == 1
    assert task_receipt_statuses(rt.db, task_id) == ["succeeded"]
    assert rt.tasks.get(task_id).intent_round == 1


def test_an_operator_requeue_is_a_new_request_that_may_repeat_the_write(
    rt: Runtime, backend: Backend
) -> None:
    task_id = rt.tasks.trigger(Trigger(task_type="ordering", title="t")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "continue"
    requeued = rt.tasks.requeue(task_id, "the customer called again")
    assert requeued.intent_round == 2
    assert rt.executions.run(task_id, requeued.generation, worker="w").outcome == "continue"
    assert backend.count("POST", "/orders") == 2
    assert task_receipt_statuses(rt.db, task_id) == ["succeeded", "succeeded"]
