"""Task tools on a real store: evidence is written fenced with the report, truncated evidence
cannot complete a task, the report comes last, and read_task_context shows the generation that
actually ran before this one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.lease_keeper import LeaseKeeper, lease_name
from orchestrator.services.tasks import Trigger
from orchestrator.store import reports as report_store
from orchestrator.store import tasks as task_store
from orchestrator.store.tables import actions, evidence, plan_revisions, reports
from orchestrator.store.types import utcnow
from orchestrator.tools.actions import ProposeAction
from orchestrator.tools.base import Fence, Tool, ToolContext, ToolResult
from orchestrator.tools.plans import PublishExecutionPlan
from orchestrator.tools.tasks import ReadTaskContext, SaveReport
from tests.executions_support import (
    fenced_ctx,
    node,
    plan_call,
    report_call,
    runtime_for,
    write_script,
)

LEASE = 60.0


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


@dataclass(frozen=True)
class Live:
    """A claimed generation and its tools, as the execution service would build them."""

    rt: Runtime
    fence: Fence
    session_id: str

    def ctx(self) -> ToolContext:
        return fenced_ctx(self.fence, self.session_id)

    def keeper(self) -> LeaseKeeper:
        return LeaseKeeper(self.rt.leases, self.rt.db, self.fence, ttl=LEASE, renew_every=20)

    def call(self, tool: Tool, arguments: dict[str, Any]) -> ToolResult:
        return tool.run(self.ctx(), tool.arguments.model_validate(arguments))

    def report(self, outcome: str, items: list[dict[str, Any]] | None = None) -> ToolResult:
        arguments: dict[str, Any] = {"summary": f"ended {outcome}", "outcome": outcome}
        if items is not None:
            arguments["evidence"] = items
        return self.call(SaveReport(self.rt.db, self.keeper()), arguments)

    def publish(self, request_id: str, nodes: list[dict[str, Any]]) -> ToolResult:
        tool = PublishExecutionPlan(self.rt.plans, self.keeper())
        return self.call(tool, plan_call("p", request_id, nodes)["arguments"])

    def propose(self, node_id: str) -> ToolResult:
        tool = ProposeAction(ActionService(self.rt.db, self.rt.plans), self.keeper())
        return self.call(tool, {"node_id": node_id, "kind": "work_order", "payload": {}})


def claim(rt: Runtime, task_id: str, generation: int) -> Live:
    token = rt.leases.acquire(lease_name(task_id), "test-worker", LEASE)
    assert token is not None
    with rt.db.transaction() as conn:
        claimed = task_store.claim_generation(
            conn,
            task_id,
            generation,
            lease_token=token,
            worker="test-worker",
            celery_task_id=None,
            lease_expires_at=utcnow() + timedelta(seconds=LEASE),
        )
    assert claimed is not None
    return Live(rt, Fence(task_id, generation, token), claimed[1])


def trigger(rt: Runtime, task_type: str = "tools", **extra: Any) -> str:
    created = rt.tasks.trigger(Trigger(task_type=task_type, title="Turbid water", **extra))
    return created.task.task_id


def item(content_ref: str, *, truncated: bool = False, origin: str = "live") -> dict[str, Any]:
    return {
        "source": "scada",
        "queried_at": "2024-05-01T08:00:00+00:00",
        "content_ref": content_ref,
        "origin": origin,
        "truncated": truncated,
        "summary": f"turbidity readings {content_ref}",
    }


def count(rt: Runtime, table: Any, task_id: str) -> int:
    with rt.db.transaction(readonly=True) as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(table).where(table.c.task_id == task_id)
            ).scalar_one()
        )


def context_of(rt: Runtime, task_id: str, generation: int) -> dict[str, Any]:
    ctx = ToolContext(
        owner=f"task:{task_id}",
        session_id="s",
        round_id="r",
        task_id=task_id,
        generation=generation,
    )
    result = ReadTaskContext(rt.db).run(ctx, None)
    assert result.status == "succeeded", result
    payload: dict[str, Any] = result.payload
    return payload


# -- evidence ---------------------------------------------------------------------------------


def test_save_report_writes_its_evidence_for_the_generation(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    result = live.report("continue", [item("scada:t1"), item("scada:t2", truncated=True)])
    assert result.status == "succeeded", result
    assert [e["content_ref"] for e in result.payload["evidence"]] == ["scada:t1", "scada:t2"]
    with rt.db.transaction(readonly=True) as conn:
        stored = report_store.evidence_of(conn, task_id, 1)
    assert [(e["content_ref"], e["truncated"], e["origin"]) for e in stored] == [
        ("scada:t1", False, "live"),
        ("scada:t2", True, "live"),
    ]
    assert stored[0]["queried_at"].startswith("2024-05-01T08:00:00")
    assert stored[0]["source"] == "scada"


def test_an_evidence_item_without_its_fields_or_time_zone_is_invalid(rt: Runtime) -> None:
    arguments = SaveReport.arguments
    bad = [
        dict(item("x"), origin="made_up"),
        dict(item("x"), queried_at="2024-05-01T08:00:00"),  # naive: no time zone
        {k: v for k, v in item("x").items() if k != "truncated"},
    ]
    for entry in bad:
        with pytest.raises(ValidationError, match="evidence"):
            arguments.model_validate({"summary": "s", "outcome": "continue", "evidence": [entry]})


def test_evidence_of_a_superseded_generation_is_refused_with_its_report(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    rt.tasks.requeue(task_id, "fresh look")
    with pytest.raises(StaleGeneration):
        live.report("completed", [item("scada:late")])
    assert count(rt, evidence, task_id) == 0
    assert count(rt, reports, task_id) == 0


def test_only_truncated_evidence_cannot_complete_and_a_refused_report_writes_nothing(
    rt: Runtime,
) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    refused = live.report("completed", [item("scada:24h", truncated=True)])
    assert (refused.status, refused.code) == ("failed", "truncated_evidence")
    assert count(rt, evidence, task_id) == 0
    assert count(rt, reports, task_id) == 0
    # A truncated result is fine for a round that does not claim the whole range.
    assert live.report("continue", [item("scada:24h", truncated=True)]).status == "succeeded"
    # The generation's evidence is all truncated: completed without new evidence is refused too.
    again = live.report("completed", [])
    assert (again.status, again.code) == ("failed", "truncated_evidence")
    # The rest of the range, queried in full, supports it.
    done = live.report("completed", [item("scada:rest")])
    assert done.status == "succeeded", done
    with rt.db.transaction(readonly=True) as conn:
        report = report_store.latest_report(conn, task_id, 1)
    assert report is not None
    assert report["outcome"] == "completed"
    assert count(rt, evidence, task_id) == 2


def test_a_completed_report_without_any_evidence_is_accepted(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    assert live.report("completed").status == "succeeded"


# -- the report comes last ------------------------------------------------------------------


def test_after_the_report_plans_and_proposals_are_refused_and_write_nothing(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    assert live.publish("r1", [node("a", "running"), node("fix", "waiting")]).status == "succeeded"
    assert live.report("continue").status == "succeeded"
    late_plan = live.publish("r2", [node("a", "completed"), node("fix", "waiting")])
    assert (late_plan.status, late_plan.code) == ("failed", "report_already_saved")
    replay = live.publish("r1", [node("a", "running"), node("fix", "waiting")])
    assert (replay.status, replay.code) == ("failed", "report_already_saved")
    late_action = live.propose("fix")
    assert (late_action.status, late_action.code) == ("failed", "report_already_saved")
    assert count(rt, plan_revisions, task_id) == 1
    assert count(rt, actions, task_id) == 0
    # Saving the report again is allowed and replaces it: the latest one counts.
    assert live.report("waiting").status == "succeeded"
    with rt.db.transaction(readonly=True) as conn:
        latest = report_store.latest_report(conn, task_id, 1)
    assert latest is not None
    assert latest["outcome"] == "waiting"


def test_a_superseded_generation_after_its_report_is_stale_not_report_already_saved(
    rt: Runtime,
) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    assert live.publish("r1", [node("a", "running")]).status == "succeeded"
    assert live.report("continue").status == "succeeded"
    rt.tasks.requeue(task_id, "fresh look")
    with pytest.raises(StaleGeneration):
        live.publish("r2", [node("a", "completed")])
    with pytest.raises(StaleGeneration):
        live.propose("a")


def test_a_plan_published_after_the_report_does_not_complete_the_round(
    rt: Runtime, scripts: Path
) -> None:
    write_script(
        scripts,
        "late",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]},
            {"tool_calls": [report_call("c2", "completed")]},
            {"tool_calls": [plan_call("c3", "r2", [node("a", "completed")])]},
            {"content": "done"},
        ],
    )
    task_id = trigger(rt, "late")
    assert rt.executions.run(task_id, 1, worker="w").ran
    view = rt.tasks.explain(task_id)
    # Judged by revision 1 (node a still running): the round continues, it does not complete.
    assert view["executions"][0]["outcome"] == "continue"
    assert (view["status"], view["generation"]) == ("queued", 2)
    assert count(rt, plan_revisions, task_id) == 1


# -- read_task_context ----------------------------------------------------------------------


def test_the_next_generation_reads_the_plan_report_and_evidence_left_before(
    rt: Runtime, scripts: Path
) -> None:
    report = report_call("c2", "continue")
    report["arguments"]["evidence"] = [item("scada:t1"), item("scada:t2", truncated=True)]
    write_script(
        scripts,
        "handover",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("a", "completed"), node("b", "running")])]},
            {"tool_calls": [report]},
            {"content": "more next round"},
        ],
    )
    task_id = trigger(rt, "handover")
    assert rt.executions.run(task_id, 1, worker="w").ran
    assert rt.tasks.get(task_id).generation == 2
    payload = context_of(rt, task_id, 2)
    previous = payload["previous_generation"]
    assert (previous["generation"], previous["outcome"]) == (1, "continue")
    assert previous["plan"]["revision"] == 1
    assert [n["id"] for n in previous["plan"]["nodes"]] == ["a", "b"]
    assert previous["report"]["outcome"] == "continue"
    assert [(e["content_ref"], e["truncated"]) for e in previous["evidence"]] == [
        ("scada:t1", False),
        ("scada:t2", True),
    ]
    assert payload["origin"] == "live"
    assert "sample_input" not in payload


def test_a_generation_superseded_before_it_started_is_skipped(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    assert live.publish("r1", [node("a", "running")]).status == "succeeded"
    assert live.report("continue", [item("scada:t1")]).status == "succeeded"
    rt.tasks.requeue(task_id, "operator: once")  # generation 1 ran, it is superseded
    rt.tasks.requeue(task_id, "operator: twice")  # generation 2 never started
    assert rt.tasks.get(task_id).generation == 3
    previous = context_of(rt, task_id, 3)["previous_generation"]
    assert previous["generation"] == 1
    assert previous["outcome"] == "superseded"
    assert previous["plan"]["nodes"][0]["id"] == "a"
    assert previous["report"]["summary"] == "ended continue"
    assert [e["content_ref"] for e in previous["evidence"]] == ["scada:t1"]


def test_no_generation_ran_before_means_no_previous_generation(rt: Runtime) -> None:
    task_id = trigger(rt)
    rt.tasks.requeue(task_id, "before it started")
    assert context_of(rt, task_id, 2)["previous_generation"] is None
    assert context_of(rt, task_id, 1)["previous_generation"] is None


def test_a_sample_input_is_labelled_peripheral_sample(rt: Runtime) -> None:
    sample = {"turbidity_ntu": 4.2, "site": "north reservoir"}
    task_id = trigger(rt, sample_input=sample)
    payload = context_of(rt, task_id, 1)
    assert payload["origin"] == "peripheral_sample"
    assert payload["sample_input"] == {"origin": "peripheral_sample", "data": sample}
