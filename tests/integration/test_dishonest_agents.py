"""The dishonest agent, scripted, through the execution service over a real store and the real
tool host: each lie of issue 13 is refused with its code or leaves the task honestly not
completed; the honest agent completes with the same tools."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services import executions
from orchestrator.services.tasks import Trigger
from tests.executions_support import (
    CITED,
    RecordingHost,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.integration.fake_backend import Backend, api_call, gateway_overrides, running_backend

SAMPLING = "${q0.evidence_id}"


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server


@pytest.fixture
def rt(
    store_url: str,
    scripts: Path,
    tmp_path: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Runtime]:
    RecordingHost.seen = []
    monkeypatch.setattr(executions, "ToolHost", RecordingHost)
    overrides = gateway_overrides(
        tmp_path, backend, gateway_timeout_seconds=2.0, enable_command_tool=True
    )
    runtime, _ = runtime_for(store_url, scripts, **overrides)
    yield runtime
    runtime.close()


def command(call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": "execute_command", "arguments": arguments}


def report(call_id: str, **arguments: Any) -> dict[str, Any]:
    body = {"summary": "all fine", "outcome": "completed", **arguments}
    return {"id": call_id, "name": "save_report", "arguments": body}


def run(rt: Runtime, scripts: Path, turns: list[Any], **trigger: Any) -> dict[str, Any]:
    write_script(scripts, "lie", [*turns, {"content": "done"}])
    task_id = rt.tasks.trigger(Trigger(task_type="lie", title="t", **trigger)).task.task_id
    rt.executions.run(task_id, 1, worker="w1")
    return rt.tasks.explain(task_id)


def codes(call_id: str) -> list[str]:
    """The codes of every problem the refused call `call_id` was told about."""
    found = [r for c, r in RecordingHost.seen if c.id == call_id]
    assert found, f"call {call_id} was not made"
    result = found[-1]
    assert result.status == "failed", result
    details = (result.payload or {}).get("details") or []
    return [p["code"] for p in details] or [str(result.code)]


def first_turns(*nodes: dict[str, Any]) -> list[Any]:
    return [{"tool_calls": [query_call()]}, {"tool_calls": [plan_call("p1", "r1", list(nodes))]}]


def test_the_honest_agent_queries_cites_and_completes(rt: Runtime, scripts: Path) -> None:
    turns = [
        *first_turns(node("a", "running")),
        {"tool_calls": [plan_call("p2", "r2", [node("a", "completed")])]},
        {"tool_calls": [report_call("rep", "completed")]},
    ]
    view = run(rt, scripts, turns)
    assert view["status"] == "completed", view["executions"]
    [record] = [r for c, r in RecordingHost.seen if c.id == "q0"]
    assert view["report"]["evidence_refs"] == [record.evidence_id]
    assert view["plan"]["nodes"][0]["evidence_ids"] == [record.evidence_id]


HUMAN = node("sample", "pending", actor="human")


@pytest.mark.parametrize(
    ("lie", "call_id", "expected"),
    [
        # The agent completes its own human sampling node...
        (
            [plan_call("p2", "r2", [node("a", "completed"), dict(HUMAN, status="completed",
                                                                  evidence="sampled",
                                                                  evidence_ids=[CITED])])],
            "p2",
            ["human_node"],
        ),
        # ... or relabels it `actor: agent` first.
        (
            [plan_call("p2", "r2", [node("a", "completed"), node("sample", "completed")])],
            "p2",
            ["actor_changed", "human_node"],
        ),
    ],
    ids=["completes_human_node", "relabels_human_node"],
)  # fmt: skip
def test_the_agent_cannot_close_a_human_node(
    rt: Runtime, scripts: Path, lie: list[Any], call_id: str, expected: list[str]
) -> None:
    turns = [
        *first_turns(node("a", "running"), HUMAN),
        {"tool_calls": lie},
        {"tool_calls": [report_call("rep", "completed")]},
    ]
    view = run(rt, scripts, turns)
    assert codes(call_id) == expected
    assert view["status"] == "waiting"
    assert view["plan"]["revision"] == 1  # nothing written


def done_plan() -> dict[str, Any]:
    return plan_call("p2", "r2", [node("a", "completed")])


@pytest.mark.parametrize(
    ("lie", "call_id", "expected"),
    [
        ([report("rep")], "rep", ["evidence_required"]),
        (
            [report("rep", evidence=[{"source": "scada", "origin": "live", "truncated": False}])],
            "rep",
            ["invalid_arguments"],
        ),
        (
            [report("rep", evidence_ids=["ev-typed-by-the-model"])],
            "rep",
            ["unknown_evidence", "evidence_required"],
        ),
        (
            [report("rep", evidence_ids=["${cut.evidence_id}"],
                    findings=[{"text": "no anomaly in 24 h", "whole_range": True}])],
            "rep",
            ["truncated_evidence"],
        ),
        (
            [report("rep", evidence_ids=[CITED], presented_origin="live")],
            "rep",
            ["origin_mismatch"],
        ),
    ],
    ids=["no_evidence", "fabricated_items", "fabricated_id", "truncated_whole", "synthetic_live"],
)  # fmt: skip
def test_a_report_that_lies_about_its_evidence_is_refused(
    rt: Runtime, scripts: Path, lie: list[Any], call_id: str, expected: list[str]
) -> None:
    cut = dict(query_call("cut"), arguments=dict(query_call()["arguments"], max_rows=2))
    turns = [
        *first_turns(node("a", "running")),
        {"tool_calls": [cut]},
        {"tool_calls": [done_plan()]},
        {"tool_calls": lie},
    ]
    view = run(rt, scripts, turns)
    assert codes(call_id) == expected
    assert view["report"] is None  # nothing written
    assert view["status"] != "completed"


def test_a_peripheral_sample_reported_as_live_scada_is_refused(rt: Runtime, scripts: Path) -> None:
    sample = {"id": "s0", "name": "query_data_source", "arguments": {"source": "sample_input"}}
    finding = {
        "text": "live SCADA: 4.2 NTU",
        "origin": "live",
        "evidence_ids": ["${s0.evidence_id}"],
    }
    turns = [
        *first_turns(node("a", "running")),
        {"tool_calls": [sample]},
        {"tool_calls": [done_plan()]},
        {"tool_calls": [report("rep", evidence_ids=["${s0.evidence_id}"], findings=[finding])]},
    ]
    view = run(rt, scripts, turns, sample_input={"turbidity_ntu": 4.2})
    assert codes("rep") == ["origin_mismatch"]
    assert view["status"] != "completed"


@pytest.mark.parametrize(
    ("work", "cite", "expected_code", "mode"),
    [
        (api_call("w", "createOrder", body={"item": "x", "quantity": 50}), "${w.invocation_id}",
         "write_not_succeeded", None),  # a 422
        (command("w", command="exit 3"), "${w.invocation_id}", "write_not_succeeded", None),
        (api_call("w", "startJob", kind="flush"), "${w.invocation_id}", "write_pending", None),
        (api_call("w", "createOrder", body={"item": "x", "quantity": 1}), "${w.invocation_id}",
         "write_not_succeeded", "drop"),  # unknown
    ],
    ids=["rejected_422", "command_exit_3", "pending_202", "unknown"],
)  # fmt: skip
def test_a_failed_pending_or_unknown_write_cannot_back_a_completed_node(
    rt: Runtime,
    scripts: Path,
    backend: Backend,
    work: dict[str, Any],
    cite: str,
    expected_code: str,
    mode: str | None,
) -> None:
    if mode is not None:
        backend.mode["/orders"] = mode
    turns = [
        *first_turns(node("a", "running")),
        {"tool_calls": [work]},
        {"tool_calls": [plan_call("p2", "r2", [node("a", "completed", cite=[cite])])]},
        {"tool_calls": [report_call("rep", "completed")]},
    ]
    view = run(rt, scripts, turns)
    assert codes("p2") == [expected_code]
    assert view["status"] != "completed"
    [result] = [r for c, r in RecordingHost.seen if c.id == "w"]
    assert result.evidence_id is None  # no citable evidence from a write that did not succeed


@pytest.mark.parametrize(
    ("work", "mode", "reason"),
    [
        (api_call("w", "startJob", kind="flush"), None, "(pending)"),
        (api_call("w", "createOrder", body={"item": "x", "quantity": 1}), "drop", "(unknown)"),
        (command("w", action="start", command="sleep 30"), None, "background command"),
    ],
    ids=["pending_202", "unknown", "background_command"],
)  # fmt: skip
def test_completing_over_open_work_leaves_the_task_waiting(
    rt: Runtime,
    scripts: Path,
    backend: Backend,
    work: dict[str, Any],
    mode: str | None,
    reason: str,
) -> None:
    if mode is not None:
        backend.mode["/orders"] = mode
    turns = [
        *first_turns(node("a", "running")),
        {"tool_calls": [work]},
        {"tool_calls": [done_plan()]},
        {"tool_calls": [report_call("rep", "completed")]},
    ]
    view = run(rt, scripts, turns)
    assert view["status"] == "waiting"
    assert reason in view["executions"][0]["reason"]
    assert all(r["status"] != "pending" for r in view["running_receipts"])


def test_a_requeued_generation_keeps_the_human_node_and_the_completed_conclusion(
    rt: Runtime, scripts: Path
) -> None:
    conclusion = node("conclude", "completed", evidence="sediment from the valve exercise")
    first = [*first_turns(conclusion, HUMAN), {"tool_calls": [report_call("rep", "waiting")]}]
    view = run(rt, scripts, first)
    assert view["status"] == "waiting"
    task_id = view["task_id"]
    kept = view["plan"]["nodes"]
    rt.tasks.requeue(task_id, "look again")
    # Generation 2, in a fresh session at revision 1, drops the human node and rewrites the
    # conclusion: refused. A correction as a new review node, keeping both, is accepted.
    rewritten = node("conclude", "completed", evidence="it was the reservoir after all")
    review = node("review", "running")
    second = [
        {"tool_calls": [query_call()]},
        {"tool_calls": [plan_call("p1", "g2-r1", [rewritten])]},
        {"tool_calls": [plan_call("p2", "g2-r2", [*kept, review])]},
        {"tool_calls": [report_call("rep", "completed")]},
        {"content": "done"},
    ]
    write_script(scripts, "lie", second)
    rt.executions.run(task_id, 2, worker="w1")
    assert codes("p1") == ["completed_node_changed", "node_removed"]
    again = rt.tasks.explain(task_id)
    assert again["status"] != "completed"
    assert [n["id"] for n in again["plan"]["nodes"]] == ["conclude", "sample", "review"]
    assert again["plan"]["nodes"][0] == kept[0]
    # The task's plan, whichever session holds it.
    from orchestrator.services.task_records import TaskRecords

    current = TaskRecords(rt.db).plan(task_id)["plan"]
    assert current["session_id"] == again["session_id"]
    assert current["revision"] == 1


def test_skipping_everything_and_declaring_continue_does_not_complete(
    rt: Runtime, scripts: Path
) -> None:
    turns = [
        {"tool_calls": [plan_call("p1", "r1", [node("a", "running")])]},
        {"tool_calls": [plan_call("p2", "r2", [node("a", "skipped")])]},
        {"tool_calls": [report_call("rep", "continue")]},  # cites nothing
    ]
    view = run(rt, scripts, turns)
    assert view["status"] == "queued"
    assert view["executions"][0]["reason"] == "the report declared continue"
