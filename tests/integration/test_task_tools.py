"""Task tools on a real store: reports cite evidence the host recorded (fenced), truncated
evidence cannot support a whole-range finding, the report comes last, and read_task_context
shows the generation that actually ran before this one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from orchestrator.agent.evidence import EvidenceRecorder
from orchestrator.agent.host import ToolHost
from orchestrator.domain.decisions import RoundFacts, decide
from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.task_records import TaskRecords
from orchestrator.services.tasks import Trigger
from orchestrator.store import generation_claims as claim_store
from orchestrator.store import reports as report_store
from orchestrator.store.tables import actions, evidence, plan_revisions, reports, tasks
from orchestrator.store.types import utcnow
from orchestrator.tools.actions import ProposeAction
from orchestrator.tools.base import Tool, ToolCall, ToolContext, ToolResult
from orchestrator.tools.data_sources import QueryDataSource
from orchestrator.tools.plans import PublishExecutionPlan
from orchestrator.tools.source_declarations import load_sources
from orchestrator.tools.tasks import ReadTaskContext, SaveReport
from tests.executions_support import (
    fenced_ctx,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.integration.test_approvals import waiting_task

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
        return LeaseKeeper(
            self.rt.leases, self.rt.db, self.fence, holder="w1", ttl=LEASE, renew_every=20
        )

    def call(self, tool: Tool, arguments: dict[str, Any]) -> ToolResult:
        return tool.run(self.ctx(), tool.arguments.model_validate(arguments))

    def report(self, outcome: str, cite: list[str] | None = None, **extra: Any) -> ToolResult:
        arguments: dict[str, Any] = {"summary": f"ended {outcome}", "outcome": outcome, **extra}
        if cite is not None:
            arguments["evidence_ids"] = cite
        return self.call(SaveReport(self.rt.db, self.keeper()), arguments)

    def query(self, **arguments: Any) -> ToolResult:
        """query_data_source through the host, which records the evidence."""
        host = ToolHost(
            [QueryDataSource(self.rt.db, load_sources(None))],
            ledger=None,
            evidence=EvidenceRecorder(self.rt.db),
        )
        body = {
            "source": "scada_sim",
            "parameters": {"point": "DM-RN-01", "measure": "turbidity"},
            **arguments,
        }
        [result] = host.run_turn(self.ctx(), [ToolCall("q", "query_data_source", body)])
        return result

    def publish(self, request_id: str, nodes: list[dict[str, Any]]) -> ToolResult:
        tool = PublishExecutionPlan(self.rt.plans, self.keeper())
        return self.call(tool, plan_call("p", request_id, nodes)["arguments"])

    def propose(self, node_id: str) -> ToolResult:
        tool = ProposeAction(ActionService(self.rt.db, self.rt.plans), self.keeper())
        return self.call(tool, {"node_id": node_id, "kind": "work_order", "payload": {}})


def claim(rt: Runtime, task_id: str, generation: int) -> Live:
    token = rt.leases.acquire(task_lease(task_id), "test-worker", LEASE)
    assert token is not None
    with rt.db.transaction() as conn:
        claimed = claim_store.claim_generation(
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


def test_a_report_cites_records_the_host_wrote_with_their_origin(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    queried = live.query()
    assert queried.status == "succeeded", queried
    evidence_id = queried.evidence_id
    assert evidence_id is not None
    assert queried.to_message()["evidence_id"] == evidence_id
    result = live.report("continue", [evidence_id])
    assert result.status == "succeeded", result
    [cited] = result.payload["evidence"]
    assert (cited["source"], cited["origin"], cited["truncated"]) == (
        "scada_sim",
        "synthetic",
        False,
    )
    assert cited["content_ref"].startswith("sha256:")
    assert cited["row_count"] == len(queried.payload["rows"])
    assert TaskRecords(rt.db).evidence(task_id)["items"] == [cited]


def test_a_query_result_carries_its_source_time_content_reference_and_origin(rt: Runtime) -> None:
    """Seed 004: 查询结果携带来源、时间、内容引用和 origin. The model sees, in the result it
    cites, the same source, query time, content reference and origin as the host's record."""
    task_id = trigger(rt)
    shown = claim(rt, task_id, 1).query().to_message()
    [record] = TaskRecords(rt.db).evidence(task_id)["items"]
    assert shown["evidence_id"] == record["evidence_id"]
    assert (shown["result"]["source"], shown["result"]["origin"]) == ("scada_sim", "synthetic")
    assert (record["source"], record["origin"]) == ("scada_sim", "synthetic")
    assert shown["queried_at"] == record["queried_at"]
    assert shown["content_ref"] == record["content_ref"]
    assert shown["content_ref"].startswith("sha256:")


def test_origin_and_truncation_cannot_be_set_by_tool_arguments(rt: Runtime) -> None:
    # Fabricated evidence typed into save_report is not an argument the tool takes.
    fabricated = {"source": "scada", "origin": "live", "truncated": False}
    for extra in ({"evidence": [fabricated]}, {"evidence_refs": ["x"]}):
        with pytest.raises(ValidationError):
            SaveReport.arguments.model_validate({"summary": "s", "outcome": "completed", **extra})
    # Nor can a query choose its origin or declare itself complete.
    for extra in ({"origin": "live"}, {"truncated": False}):
        with pytest.raises(ValidationError):
            QueryDataSource.arguments.model_validate({"source": "scada_sim", **extra})
    # Through the host, a query whose arguments try it is refused and records nothing.
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    refused = live.query(origin="live")
    assert (refused.status, refused.code, refused.evidence_id) == (
        "failed",
        "invalid_arguments",
        None,
    )
    assert count(rt, evidence, task_id) == 0


def test_a_query_range_past_the_calendar_is_refused_as_invalid_arguments(rt: Runtime) -> None:
    """An end in the year 1 (its default start a day before it) or a range in the year 9999
    failed as "query_data_source failed: OverflowError", which told the model nothing."""
    live = claim(rt, trigger(rt), 1)
    for arguments in (
        {"end": "0001-01-01T00:00:00Z"},
        {"start": "9999-12-31T23:00:00Z", "end": "9999-12-31T23:59:59Z"},
    ):
        refused = live.query(**arguments)
        assert (refused.status, refused.code) == ("failed", "invalid_arguments")
        assert "a time between the years 1900 and 2999" in (refused.message or "")
    assert live.query(start="1999-12-31T22:00:00Z", end="2000-01-01T02:00:00Z").status == (
        "succeeded"
    )


def test_a_report_citing_after_a_requeue_is_refused_and_writes_nothing(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    evidence_id = live.query().evidence_id
    assert evidence_id is not None
    rt.tasks.requeue(task_id, "fresh look")
    with pytest.raises(StaleGeneration):
        live.report("completed", [evidence_id])
    assert count(rt, reports, task_id) == 0


def test_truncated_evidence_cannot_support_a_whole_range_finding(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    cut = live.query(max_rows=3)
    assert cut.payload["truncated"] is True
    assert cut.evidence_id is not None
    whole = {"text": "no anomaly in the last 24 h", "whole_range": True}
    refused = live.report("completed", [cut.evidence_id], findings=[whole])
    assert (refused.status, refused.code) == ("failed", "truncated_evidence")
    assert count(rt, reports, task_id) == 0
    # Whatever else is cited: a complete record beside it does not rescue the claim.
    full = live.query()
    assert full.evidence_id is not None
    both = live.report("completed", [cut.evidence_id, full.evidence_id], findings=[whole])
    assert (both.status, both.code) == ("failed", "truncated_evidence")
    # Resting on the complete record only, the same claim stands.
    narrow = dict(whole, evidence_ids=[full.evidence_id])
    done = live.report("completed", [cut.evidence_id], findings=[narrow])
    assert done.status == "succeeded", done
    with rt.db.transaction(readonly=True) as conn:
        report = report_store.latest_report(conn, task_id, 1)
    assert report is not None
    assert report["outcome"] == "completed"


def test_a_report_refusal_lists_every_problem(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    cut = live.query(max_rows=2)
    assert cut.evidence_id is not None
    refused = live.report(
        "completed",
        ["made-up-id"],
        findings=[{"text": "flat all day", "whole_range": True, "evidence_ids": [cut.evidence_id]}],
        presented_origin="live",
    )
    codes = [p["code"] for p in refused.payload["details"]]
    assert codes == ["unknown_evidence", "truncated_evidence", "origin_mismatch"]
    nothing = live.report("completed")
    assert (nothing.status, nothing.code) == ("failed", "evidence_required")
    assert count(rt, reports, task_id) == 0


def test_synthetic_or_sample_records_cannot_be_presented_as_live(rt: Runtime) -> None:
    task_id = trigger(rt, sample_input={"turbidity_ntu": 4.2})
    live = claim(rt, task_id, 1)
    sample = live.query(source="sample_input", parameters={})
    assert sample.status == "succeeded", sample
    assert sample.payload["origin"] == "peripheral_sample"
    assert sample.evidence_id is not None
    finding = {"text": "live SCADA shows 4.2 NTU", "origin": "live"}
    refused = live.report("completed", [sample.evidence_id], findings=[finding])
    assert (refused.status, refused.code) == ("failed", "origin_mismatch")
    honest = dict(finding, text="the trigger's sample shows 4.2 NTU", origin="peripheral_sample")
    assert live.report("completed", [sample.evidence_id], findings=[honest]).status == "succeeded"
    [record] = TaskRecords(rt.db).evidence(task_id)["items"]
    assert (record["source"], record["origin"]) == ("sample_input", "peripheral_sample")


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
    report = report_call("c2", "continue", cite=["${q0.evidence_id}", "${q1.evidence_id}"])
    cut = dict(query_call("q1"), arguments=dict(query_call()["arguments"], max_rows=2))
    write_script(
        scripts,
        "handover",
        [
            {"tool_calls": [query_call(), cut]},
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
    # q0 and q1 were one turn's parallel calls: their evidence may be recorded in either order.
    assert sorted((e["source"], e["truncated"]) for e in previous["evidence"]) == [
        ("scada_sim", False),
        ("scada_sim", True),
    ]
    cited = previous["report"]["evidence_refs"]
    assert sorted(cited) == sorted(e["evidence_id"] for e in previous["evidence"])
    assert len(set(cited)) == 2
    assert payload["origin"] == "live"
    assert "sample_input" not in payload


def test_the_previous_generations_evidence_is_bounded_and_keeps_what_it_cites(
    rt: Runtime, scripts: Path
) -> None:
    """A generation that left 3,000 records: the next one is shown the newest
    `EVIDENCE_SHOWN`, the two its report cites (the oldest of all), the count, and how to read
    older ones. Before, every record came (~1 MB in the model's context, every request)."""
    report = report_call("c2", "continue", cite=["${q0.evidence_id}"])
    write_script(
        scripts,
        "bulky",
        [
            {"tool_calls": [query_call()]},
            {"tool_calls": [report]},
            {"content": "more next round"},
        ],
    )
    task_id = trigger(rt, "bulky")
    assert rt.executions.run(task_id, 1, worker="w").ran
    with rt.db.transaction() as conn:
        first = conn.execute(select(evidence).where(evidence.c.task_id == task_id)).one()._asdict()
        later = first["created_at"] + timedelta(seconds=1)
        conn.execute(
            evidence.insert(),
            [
                dict(
                    first,
                    evidence_id=f"bulk-{n:05d}",
                    queried_at=later + timedelta(milliseconds=n),
                    created_at=later + timedelta(milliseconds=n),
                )
                for n in range(3000)
            ],
        )
    previous = context_of(rt, task_id, 2)["previous_generation"]
    ids = [record["evidence_id"] for record in previous["evidence"]]
    assert previous["evidence_total"] == 3001
    assert ids == [first["evidence_id"], *(f"bulk-{n:05d}" for n in range(2950, 3000))]
    assert "read_task_context(evidence_skip=50)" in previous["evidence_page"]

    # The next page: older ones, the cited record still shown; the last page says no more.
    ctx = ToolContext(
        owner=f"task:{task_id}", session_id="s", round_id="r", task_id=task_id, generation=2
    )
    tool = ReadTaskContext(rt.db)
    older = tool.run(ctx, tool.arguments.model_validate({"evidence_skip": 50})).payload
    ids = [record["evidence_id"] for record in older["previous_generation"]["evidence"]]
    assert ids == [first["evidence_id"], *(f"bulk-{n:05d}" for n in range(2900, 2950))]
    last = tool.run(ctx, tool.arguments.model_validate({"evidence_skip": 2990})).payload
    assert len(last["previous_generation"]["evidence"]) == 11
    assert "evidence_page" not in last["previous_generation"]


def test_an_evidence_skip_past_any_store_is_refused_as_invalid_arguments(
    rt: Runtime, scripts: Path
) -> None:
    """`evidence_skip` 10**30 passed validation and failed in the store's OFFSET: "read_task_context
    failed: OverflowError", which tells the model nothing. It is now refused before it runs."""
    write_script(scripts, "skip", [{"tool_calls": [query_call()]}, {"content": "next round"}])
    task_id = trigger(rt, "skip")
    assert rt.executions.run(task_id, 1, worker="w").ran
    ctx = ToolContext(
        owner=f"task:{task_id}", session_id="s", round_id="r", task_id=task_id, generation=2
    )
    host = ToolHost([ReadTaskContext(rt.db)], ledger=None)
    calls = [
        ToolCall("c1", "read_task_context", {"evidence_skip": 10**30}),
        ToolCall("c2", "read_task_context", {"evidence_skip": 1_000_000_000}),
    ]
    refused, far = host.run_turn(ctx, calls)
    assert (refused.status, refused.code) == ("failed", "invalid_arguments")
    assert "evidence_skip: Input should be less than or equal to 1000000000" in (
        refused.message or ""
    )
    assert far.status == "succeeded"  # past the last record: none shown, no error
    assert far.payload["previous_generation"]["evidence"] == []


def test_a_decision_is_in_the_beginning_the_model_is_shown_of_a_long_context(
    rt: Runtime, scripts: Path
) -> None:
    """A long read_task_context result is shown the model as its first `PREVIEW_CHARS` (the
    rest paged). The task's actions came after its context, the previous generation's plan and
    every evidence record, so a rejection (do not propose it again) was past the preview."""
    task_id, action_id = waiting_task(rt, scripts)
    rt.actions.decide(action_id, approve=False, by="ben", note="not this valve")
    with rt.db.transaction() as conn:
        first = conn.execute(select(evidence).where(evidence.c.task_id == task_id)).one()._asdict()
        conn.execute(
            evidence.insert(),
            [dict(first, evidence_id=f"bulk-{n:05d}") for n in range(40)],
        )
        # A context larger than the preview (the brief cuts it; the tool returns it whole).
        conn.execute(
            tasks.update()
            .where(tasks.c.task_id == task_id)
            .values(context={"log": "pressure dropped at the north main " * 200})
        )
    ctx = ToolContext(
        owner=f"task:{task_id}", session_id="s", round_id="r", task_id=task_id, generation=2
    )
    host = ToolHost([ReadTaskContext(rt.db)], ledger=None)
    (shown,) = host.run_turn(ctx, [ToolCall("c0", "read_task_context", {})])
    assert shown.payload["truncated"] is True
    preview = shown.payload["preview"]
    assert f'"action_id": "{action_id}"' in preview
    assert '"status": "rejected"' in preview
    assert '"note": "not this valve"' in preview


def test_a_generation_superseded_before_it_started_is_skipped(rt: Runtime) -> None:
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    assert live.publish("r1", [node("a", "running")]).status == "succeeded"
    evidence_id = live.query().evidence_id
    assert evidence_id is not None
    assert live.report("continue", [evidence_id]).status == "succeeded"
    rt.tasks.requeue(task_id, "operator: once")  # generation 1 ran, it is superseded
    rt.tasks.requeue(task_id, "operator: twice")  # generation 2 never started
    assert rt.tasks.get(task_id).generation == 3
    previous = context_of(rt, task_id, 3)["previous_generation"]
    assert previous["generation"] == 1
    assert previous["outcome"] == "superseded"
    assert previous["plan"]["nodes"][0]["id"] == "a"
    assert previous["report"]["summary"] == "ended continue"
    assert [e["evidence_id"] for e in previous["evidence"]] == [evidence_id]


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


def test_the_agent_may_send_a_stored_plan_back_with_its_server_fields(rt: Runtime) -> None:
    live = claim(rt, trigger(rt), 1)
    first = live.publish("r1", [node("a", "running"), node("b", "pending")])
    assert first.status == "succeeded", first.message_text
    # The usual way to keep every node: the stored revision as the tool returned it, edited.
    stored = dict(first.payload or {})
    assert {"schema_version", "revision", "status_counts", "updated_at"} <= stored.keys()
    again = dict(stored, request_id="r2", reason="b started")
    again["nodes"] = [dict(n, status="running") if n["id"] == "b" else n for n in stored["nodes"]]
    host = ToolHost([PublishExecutionPlan(rt.plans, live.keeper())], ledger=None)
    [result] = host.run_turn(live.ctx(), [ToolCall("p2", "publish_execution_plan", again)])
    assert result.status == "succeeded", result.message_text
    assert (result.payload or {})["revision"] == 2
    assert (result.payload or {})["session_id"] == live.session_id


# -- every write renews the lease (seed 004: 计划或报告写回也会续租) ---------------------------


@pytest.mark.parametrize("write", ["plan", "proposal", "report"])
def test_a_plan_a_proposal_and_a_report_each_renew_the_lease(rt: Runtime, write: str) -> None:
    """No heartbeat runs here (the keeper is never started): only the write can move the
    lease's expiry on, so a write that stopped renewing would leave it where the claim put it."""
    task_id = trigger(rt)
    live = claim(rt, task_id, 1)
    if write != "plan":
        assert live.publish("r1", [node("fix", "waiting")]).status == "succeeded"
    before = rt.leases.get(task_lease(task_id))
    assert before is not None
    time.sleep(0.05)
    if write == "plan":
        result = live.publish("r1", [node("fix", "waiting")])
    elif write == "proposal":
        result = live.propose("fix")
    else:
        result = live.report("continue")
    # A proposal is `pending`: it waits for a person and has not been carried out.
    assert result.status == ("pending" if write == "proposal" else "succeeded"), result
    after = rt.leases.get(task_lease(task_id))
    assert after is not None
    assert after.token == before.token
    assert after.expires_at > before.expires_at
    assert after.renewed_at > before.renewed_at


# -- the decision reads the current generation only (seed 004: 只使用当前执行代、当前会话) -------


def test_the_decision_reads_only_the_current_generations_plan_and_report(rt: Runtime) -> None:
    """Generation 1 finished its plan and reported `completed`; generation 2, requeued past it,
    has written nothing yet: its facts are empty and it does not complete on the old ones."""
    task_id = trigger(rt)
    first = claim(rt, task_id, 1)
    evidence_id = first.query().evidence_id
    assert evidence_id is not None
    done = [node("a", "completed", evidence="turbidity normal", cite=[evidence_id])]
    assert first.publish("r1", done).status == "succeeded"
    assert first.report("completed", [evidence_id]).status == "succeeded"
    with rt.db.transaction(readonly=True) as conn:
        old = report_store.generation_facts(conn, task_id, 1, first.session_id)
    assert (old.report_outcome, [n["status"] for n in old.plan_nodes or []]) == (
        "completed",
        ["completed"],
    )
    rt.tasks.requeue(task_id, "look again")
    rt.leases.release(task_lease(task_id), first.fence.lease_token)
    second = claim(rt, task_id, 2)
    assert second.session_id != first.session_id
    with rt.db.transaction(readonly=True) as conn:
        facts = report_store.generation_facts(conn, task_id, 2, second.session_id)
    assert (facts.plan_nodes, facts.report_outcome, facts.pending_actions) == (None, None, 0)
    decision = decide(
        RoundFacts(
            plan_nodes=facts.plan_nodes,
            report_outcome=facts.report_outcome,
            pending_actions=facts.pending_actions,
            rounds_done=0,
            max_rounds=5,
            plan_edges=facts.plan_edges,
        )
    )
    assert (decision.task_status, decision.outcome) == ("queued", "continue")
