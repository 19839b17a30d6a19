"""Invariant 23 over a real store: the decision reads the task's receipts and the round's
background commands; dishonest agents that declare `completed` over open work do not complete."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store.receipts import ReceiptLedger
from tests.executions_support import (
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.integration.fake_backend import Backend, api_call, gateway_overrides, running_backend
from tests.integration.receipt_rows import running_task


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server


@pytest.fixture
def rt(store_url: str, scripts: Path, tmp_path: Path, backend: Backend) -> Iterator[Runtime]:
    overrides = gateway_overrides(
        tmp_path, backend, gateway_timeout_seconds=2.0, enable_command_tool=True
    )
    runtime, _ = runtime_for(store_url, scripts, **overrides)
    yield runtime
    runtime.close()


def completing_after(work: list[dict[str, Any]], outcome: str = "completed") -> list[Any]:
    """Do `work` (tool calls), then claim everything done and report `outcome`."""
    return [
        {"tool_calls": [query_call(), plan_call("p1", "r1", [node("a", "running")])]},
        *([{"tool_calls": work}] if work else []),
        {"tool_calls": [plan_call("p2", "r2", [node("a", "completed")])]},
        {"tool_calls": [report_call("rep", outcome)]},
        {"content": "all done"},
    ]


def command(call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": "execute_command", "arguments": arguments}


def run_task(rt: Runtime, scripts: Path, turns: list[Any]) -> dict[str, Any]:
    write_script(scripts, "dishonest", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="dishonest", title="t")).task.task_id
    rt.executions.run(task_id, 1, worker="w1")
    return rt.tasks.explain(task_id)


def receipts(rt: Runtime, task_id: str) -> dict[str, str]:
    return {r.tool_name: r.status for r in ReceiptLedger(rt.db).list_for_owner(f"task:{task_id}")}


def test_a_pending_202_job_keeps_the_task_from_completing(rt: Runtime, scripts: Path) -> None:
    view = run_task(rt, scripts, completing_after([api_call("j", "startJob", kind="flush")]))
    assert view["status"] == "waiting"
    assert "call_api" in view["executions"][0]["reason"]
    assert "(pending)" in view["executions"][0]["reason"]


def test_an_unknown_write_keeps_the_task_from_completing(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    backend.mode["/orders"] = "drop"
    view = run_task(
        rt,
        scripts,
        completing_after([api_call("o", "createOrder", body={"item": "x", "quantity": 1})]),
    )
    assert receipts(rt, view["task_id"]) == {"call_api": "unknown"}
    assert view["status"] == "waiting"
    assert "(unknown)" in view["executions"][0]["reason"]


def test_a_background_command_still_running_blocks_and_is_reaped_as_unknown(
    rt: Runtime, scripts: Path
) -> None:
    view = run_task(
        rt, scripts, completing_after([command("bg", action="start", command="sleep 30")])
    )
    assert view["status"] == "waiting"
    assert "background command" in view["executions"][0]["reason"]
    # Reaped at round end: never left `pending` forever.
    assert receipts(rt, view["task_id"]) == {"execute_command": "unknown"}


def test_a_background_command_that_ended_settles_its_receipt_and_allows_completion(
    rt: Runtime, scripts: Path
) -> None:
    started = command("bg", action="start", command="exit 0")
    turns = completing_after([started])
    # The model thinks a moment: the command has ended by the round's end.
    read = {"id": "ctx", "name": "read_task_context", "arguments": {}}
    turns.insert(2, {"delay_s": 0.5, "tool_calls": [read]})
    view = run_task(rt, scripts, turns)
    assert receipts(rt, view["task_id"]) == {"execute_command": "succeeded"}
    assert view["status"] == "completed", view["executions"][0]["reason"]


def test_a_report_declaring_waiting_never_completes(rt: Runtime, scripts: Path) -> None:
    view = run_task(rt, scripts, completing_after([], outcome="waiting"))
    assert view["status"] == "queued"  # nothing is awaited: it continues, never completes
    assert view["executions"][0]["reason"] == "the report declared waiting, but nothing is awaited"


@pytest.mark.parametrize("how", ["requeue", "cancel"])
def test_running_receipts_become_unknown_when_the_generation_ends(rt: Runtime, how: str) -> None:
    task_id, session_id, fence = running_task(rt.db)
    ledger = ReceiptLedger(rt.db)
    claim = ledger.claim(
        owner=f"task:{task_id}",
        session_id=session_id,
        tool_name="call_api",
        identity_key="k1",
        args_digest="0" * 64,
        fence=fence,
    )
    assert claim.granted
    if how == "requeue":
        rt.tasks.requeue(task_id, "look again")
    else:
        rt.tasks.cancel(task_id)
    after = ledger.get(claim.receipt.invocation_id)
    assert after is not None
    assert after.status == "unknown"
    # The finisher of the ended generation cannot overwrite it.
    assert not ledger.finish(
        claim.receipt.invocation_id, claim.receipt.claim_token, status="succeeded", summary="x"
    )
    view = rt.tasks.explain(task_id)
    assert [r["invocation_id"] for r in view["unknown_receipts"]] == [claim.receipt.invocation_id]
