"""Pure rules of issue 13: who may close what, what a completed node and a report cite, the
verification match, the data-source declarations and the simulated SCADA source."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.script_refs import resolve_refs
from orchestrator.domain.evidence import Finding, report_problems
from orchestrator.domain.plan_authority import authority_problems, citation_problems
from orchestrator.domain.plans import CODES
from orchestrator.tools import scada_sim
from orchestrator.tools.base import ToolResult
from orchestrator.tools.data_sources import QueryArgs, QueryDataSource
from orchestrator.tools.gateway import holds_written
from orchestrator.tools.source_declarations import DataSourceError, Limits, load_sources
from orchestrator.tools.source_rows import envelope


def n(node_id: str, status: str, actor: str = "agent", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "status": status, "actor": actor, **extra}


def codes(problems: list[dict[str, Any]]) -> list[str]:
    return [p["code"] for p in problems]


# -- who may close what -----------------------------------------------------------------------


@pytest.mark.parametrize("status", ["completed", "failed", "skipped"])
def test_an_agent_cannot_close_a_human_node_new_or_existing(status: str) -> None:
    assert codes(authority_problems([n("h", status, "human")], None)) == ["human_node"]
    previous = [n("h", "pending", "human")]
    assert codes(authority_problems([n("h", status, "human")], previous)) == ["human_node"]


def test_a_person_may_close_it_and_the_agent_may_keep_what_the_person_set() -> None:
    previous = [n("h", "pending", "human")]
    assert authority_problems([n("h", "completed", "human")], previous, writer="person") == []
    closed = [n("h", "completed", "human")]
    assert authority_problems([n("h", "completed", "human")], closed) == []
    assert authority_problems([n("h", "waiting", "human")], previous) == []


@pytest.mark.parametrize("closed", ["failed", "skipped"])
def test_an_agent_cannot_reclose_a_human_node_a_person_closed(closed: str) -> None:
    # "cancelled" is not a status only a person sets, but a person's close is not the agent's
    # to overwrite: the node and its who-and-when stay as the person left them.
    previous = [n("h", closed, "human", reason=f"{closed} by lab at 10:00")]
    found = authority_problems([n("h", "cancelled", "human", reason="not needed")], previous)
    assert codes(found) == ["human_node"]
    assert authority_problems(previous, previous) == []


@pytest.mark.parametrize(
    "rewrite",
    [
        {"reason": "completed by the agent at 09:00"},
        {"reason": None},
        {"evidence": "0.1 mg/L"},
        {"evidence_ids": ["e1"]},
    ],
    ids=["reason", "reason-dropped", "evidence", "evidence_ids"],
)
def test_an_agent_cannot_rewrite_who_closed_a_human_node_even_keeping_its_status(
    rewrite: dict[str, Any],
) -> None:
    closed = n("h", "completed", "human", evidence="0.4 mg/L", reason="completed by lab at 10:00")
    found = authority_problems([{**closed, **rewrite}], [closed])
    assert codes(found) == ["human_node"]
    assert "keep it as it is" in found[0]["message"]
    # Kept as the person left it (the stored form: no reason is None, no evidence is ""), or
    # with what a person's closing cannot be about (description) changed, it is accepted.
    stored = {**closed, "description": "", "evidence_ids": None}
    assert authority_problems([dict(closed, description="")], [stored]) == []
    assert authority_problems([closed], [closed]) == []


def test_a_node_actor_never_changes_whoever_writes() -> None:
    previous = [n("h", "pending", "human")]
    for writer in ("agent", "person"):
        found = authority_problems([n("h", "pending", "agent")], previous, writer=writer)
        assert codes(found) == ["actor_changed"]


def test_the_action_id_is_kept_unless_a_new_proposal_replaced_a_superseded_action() -> None:
    previous = [n("fix", "waiting", action_id="a1")]
    assert codes(authority_problems([n("fix", "waiting")], previous)) == ["action_id_removed"]
    other = [n("fix", "waiting", action_id="a2")]
    statuses = {"a1": "pending_approval", "a2": "pending_approval"}
    found = authority_problems(other, previous, action_statuses=statuses)
    assert codes(found) == ["action_id_removed"]
    replaced = {"a1": "superseded", "a2": "pending_approval"}
    assert authority_problems(other, previous, action_statuses=replaced) == []


@pytest.mark.parametrize(
    ("status", "refused"),
    [("pending_approval", True), ("rejected", True), ("superseded", True), ("approved", False)],
)
def test_a_node_whose_action_is_not_approved_cannot_be_completed(
    status: str, refused: bool
) -> None:
    previous = [n("fix", "waiting", action_id="a1")]
    found = authority_problems(
        [n("fix", "completed", action_id="a1")], previous, action_statuses={"a1": status}
    )
    assert codes(found) == (["action_not_approved"] if refused else [])


def test_a_node_cannot_name_an_action_that_is_not_one_of_its_tasks() -> None:
    # `action_statuses` holds the task's actions only: another task's approved action, or an
    # id nobody proposed, is not there, and cannot open the way to completing the node.
    found = authority_problems(
        [n("fix", "completed", action_id="other-task-action")],
        [n("fix", "waiting")],
        action_statuses={},
    )
    assert codes(found) == ["unknown_action"]
    assert found[0]["action_id"] == "other-task-action"
    assert codes(authority_problems([n("fix", "pending", action_id="x")], None)) == [
        "unknown_action"
    ]
    # An id the node already carried is the server's write-back: not looked at again.
    kept = [n("fix", "waiting", action_id="a1")]
    assert authority_problems(kept, kept, action_statuses={}) == []
    own = {"a1": "approved"}
    assert (
        authority_problems([n("fix", "completed", action_id="a1")], None, action_statuses=own) == []
    )


def test_a_completed_agent_node_cites_evidence_or_a_succeeded_write() -> None:
    writes = {"w-ok": "succeeded", "w-202": "pending", "w-422": "failed", "w-lost": "unknown"}
    evidence = {"e1"}

    def check(cited: list[str] | None) -> list[str]:
        node = n("a", "completed", **({"evidence_ids": cited} if cited is not None else {}))
        return codes(citation_problems([node], None, evidence=evidence, writes=writes))

    assert check(None) == ["citation_required"]
    assert check([]) == ["citation_required"]
    assert check(["e1"]) == []
    assert check(["w-ok"]) == []
    assert check(["w-202"]) == ["write_pending"]
    assert check(["w-422", "w-lost"]) == ["write_not_succeeded", "write_not_succeeded"]
    assert check(["made-up"]) == ["unknown_evidence"]
    # Kept as it was completed before: not checked again; human nodes are not the agent's.
    done = [n("a", "completed", evidence_ids=["gone"])]
    assert citation_problems(done, done, evidence=set(), writes={}) == []
    human = [n("h", "completed", "human")]
    assert citation_problems(human, None, evidence=set(), writes={}) == []


def test_every_new_code_is_in_the_plan_codes() -> None:
    new = {
        "human_node",
        "actor_changed",
        "action_id_removed",
        "action_not_approved",
        "citation_required",
        "unknown_evidence",
        "write_pending",
        "write_not_succeeded",
        "unknown_action",
        "duplicate_edge",
        "failed_node_reopened",
    }
    assert new <= set(CODES)


# -- reports ----------------------------------------------------------------------------------

RECORDS = {
    "live": {"origin": "live", "truncated": False},
    "cut": {"origin": "live", "truncated": True},
    "sim": {"origin": "synthetic", "truncated": False},
    "sample": {"origin": "peripheral_sample", "truncated": False},
}


def report(outcome: str = "completed", cited: tuple[str, ...] = ("live",), *findings: Finding,
           presented: str | None = None) -> list[str]:  # fmt: skip
    return codes(
        report_problems(
            outcome=outcome,
            cited=list(cited),
            findings=list(findings),
            presented_origin=presented,
            records=RECORDS,
        )
    )


def test_a_completed_report_cites_at_least_one_record_of_the_task() -> None:
    assert report() == []
    assert report(cited=()) == ["evidence_required"]
    assert report(cited=("nope",)) == ["unknown_evidence", "evidence_required"]
    assert report("continue", ()) == []


def test_a_whole_range_finding_on_a_truncated_record_is_refused_whatever_else_is_cited() -> None:
    whole = Finding("no anomaly in 24 h", (), True, None)
    assert report("completed", ("live", "cut"), whole) == ["truncated_evidence"]
    assert report("completed", ("cut",), Finding("a spike at 08:40", (), False, None)) == []
    assert report("completed", ("cut",), Finding("flat", ("live",), True, None)) == []


def test_synthetic_or_sample_records_are_never_presented_as_live() -> None:
    assert report("completed", ("sim",), presented="live") == ["origin_mismatch"]
    assert report("completed", ("sample",), Finding("x", (), False, "live")) == ["origin_mismatch"]
    assert report("completed", ("sim",), presented="synthetic") == []
    assert report("completed", ("live",), presented="live") == []


# -- verification -----------------------------------------------------------------------------


def test_a_read_back_with_server_added_fields_verifies_a_full_replacement() -> None:
    written = {"value": 5, "unit": "bar"}
    assert holds_written({"value": 5, "unit": "bar", "id": 7, "updated_at": "now"}, written)
    assert not holds_written({"value": 6, "unit": "bar", "id": 7}, written)
    assert not holds_written({"value": 5}, written)
    assert not holds_written([5], written)
    assert holds_written(5, 5)


# -- data sources -----------------------------------------------------------------------------


def test_the_bundled_declaration_is_the_synthetic_simulator() -> None:
    sources = load_sources(None)
    assert {name: s.origin for name, s in sources.items()} == {"scada_sim": "synthetic"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sources: [", "not valid JSON/YAML"),
        ("sources: []", "sources"),
        ("sources:\n - {name: a, description: d, kind: ftp, origin: live}", "kind"),
        ("sources:\n - {name: a, description: d, kind: scada_sim, origin: live}", "synthetic"),
        ("sources:\n - {name: a, description: d, kind: scada_sim, origin: synthetic}\n"
         " - {name: a, description: d, kind: scada_sim, origin: synthetic}", "twice"),
        ("sources:\n - {name: a, description: d, kind: http_json, origin: live}", "needs spec"),
    ],
)  # fmt: skip
def test_a_bad_declaration_is_one_line_naming_the_setting(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataSourceError) as caught:
        load_sources(path)
    message = str(caught.value)
    assert message.startswith(f"ORCH_DATA_SOURCES ({path}):")
    assert expected in message
    assert "\n" not in message
    with pytest.raises(DataSourceError, match="cannot read"):
        load_sources(tmp_path / "missing.json")


def test_a_json_declaration_loads(tmp_path: Path) -> None:
    path = tmp_path / "sources.json"
    declared = {"name": "sim", "description": "d", "kind": "scada_sim", "origin": "synthetic"}
    path.write_text(json.dumps({"sources": [declared]}), encoding="utf-8")
    assert list(load_sources(path)) == ["sim"]


def declare_http_source(folder: Path, timeout: float) -> Path:
    """A declaration of one `http_json` source answering in `timeout` seconds at most."""
    spec = {
        "openapi": "3.0.3",
        "info": {"title": "utility backend", "version": "1"},
        "paths": {"/report": {"get": {"operationId": "getReport", "responses": {"200": {}}}}},
    }
    (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    sim = {"name": "sim", "kind": "scada_sim", "origin": "synthetic", "timeout_seconds": 120}
    report = {
        "name": "report",
        "kind": "http_json",
        "origin": "live",
        "spec": "spec.json",
        "base_url": "http://127.0.0.1:9",
        "operation_id": "getReport",
        "timeout_seconds": timeout,
    }
    path = folder / "sources.json"
    sources = [dict(source, description="d") for source in (sim, report)]
    path.write_text(json.dumps({"sources": sources}), encoding="utf-8")
    return path


@pytest.mark.parametrize("timeout", [60, 90, 120])
def test_a_source_the_host_would_give_up_on_before_its_own_timeout_is_refused(
    tmp_path: Path, timeout: float
) -> None:
    """A source whose timeout reaches ORCH_TOOL_TIMEOUT_SECONDS is given up by the host before
    its own `source_timeout` answer could come: refused at start, naming both settings."""
    path = declare_http_source(tmp_path, timeout)
    assert list(load_sources(path)) == ["sim", "report"]  # fine on its own
    with pytest.raises(DataSourceError) as caught:
        load_sources(path, tool_timeout_seconds=60)
    message = str(caught.value)
    assert message.startswith(f"ORCH_DATA_SOURCES ({path}): report: timeout_seconds ")
    assert f"must be below ORCH_TOOL_TIMEOUT_SECONDS ({timeout:g} >= 60)" in message
    assert "\n" not in message


def test_a_source_answering_within_the_tool_timeout_loads_and_the_simulator_has_no_call(
    tmp_path: Path,
) -> None:
    # The simulator's timeout_seconds bounds no call (it reads no network): not compared.
    path = declare_http_source(tmp_path, 59.5)
    assert load_sources(path, tool_timeout_seconds=60)["report"].timeout_seconds == 59.5


def test_the_simulator_is_deterministic_and_shows_the_demo_story() -> None:
    start = datetime(2026, 12, 3, tzinfo=UTC)
    end = start + timedelta(days=1)
    turbidity = scada_sim.readings("DM-RN-01", "turbidity", start, end)
    assert len(turbidity) == 144
    assert turbidity == scada_sim.readings("DM-RN-01", "turbidity", start, end)
    peak = max(turbidity, key=lambda r: r["value"])
    assert (peak["value"], peak["time"]) == (4.1, "2026-12-03T08:40:00+00:00")
    pressure = scada_sim.readings("DM-RN-01", "pressure", start, end)
    assert min(r["value"] for r in pressure) == 1.9


def test_limits_cut_rows_and_characters_and_say_so() -> None:
    rows = [{"i": i, "text": "x" * 50} for i in range(100)]
    start = end = datetime(2026, 12, 3, tzinfo=UTC)
    by_rows = envelope("s", "synthetic", start, end, rows, 10, Limits()).payload
    assert (by_rows["row_count"], by_rows["truncated"]) == (10, True)
    by_chars = envelope("s", "synthetic", start, end, rows, 100, Limits(max_chars=1000)).payload
    assert by_chars["truncated"] is True
    assert len(json.dumps(by_chars["rows"])) <= 1000
    whole = envelope("s", "synthetic", start, end, rows[:5], 10, Limits()).payload
    assert whole["truncated"] is False


def test_origin_comes_from_the_declaration_not_the_arguments() -> None:
    tool = QueryDataSource(db=None, sources=load_sources(None))  # type: ignore[arg-type]
    facts = tool.evidence_facts(
        QueryArgs(source="scada_sim"),
        ToolResult.ok({"rows": [1, 2], "truncated": True, "origin": "live"}),
    )
    assert facts is not None
    # The payload's claim of `live` is ignored: the declaration says synthetic.
    assert (facts.origin, facts.truncated, facts.row_count) == ("synthetic", True, 2)
    for extra in ({"origin": "live"}, {"truncated": False}, {"evidence_id": "x"}):
        with pytest.raises(ValueError, match="Extra inputs"):
            QueryArgs.model_validate({"source": "scada_sim", **extra})


# -- scripted references ----------------------------------------------------------------------


def test_script_references_take_ids_from_earlier_results() -> None:
    messages = [
        {"role": "tool", "tool_call_id": "q1", "content": json.dumps({"evidence_id": "e-1",
                                                                      "result": {"rows": [7]}})},
    ]  # fmt: skip
    arguments = {
        "evidence_ids": ["${q1.evidence_id}", "${q2.evidence_id}"],
        "nested": {"first": "${q1.result.rows.0}"},
        "text": "not ${q1.evidence_id} a reference",
    }
    assert resolve_refs(arguments, messages) == {
        "evidence_ids": ["e-1", "${q2.evidence_id}"],
        "nested": {"first": 7},
        "text": "not ${q1.evidence_id} a reference",
    }
