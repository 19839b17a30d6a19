"""`GET /api/v1/tasks/{id}/plan` and `/evidence`, and `orchestrator tasks evidence ID`, over a
task whose execution queried the simulated SCADA source and completed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic_core import to_jsonable_python

from orchestrator.api.app import create_app
from orchestrator.domain.recovery import CallRecord, Snapshot
from orchestrator.domain.times import wire_time
from orchestrator.runtime import Runtime
from orchestrator.services.task_records import TaskRecords
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import snapshots as snapshot_store
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger
from tests.acceptance.fleet import ORCHESTRATOR
from tests.executions_support import CITED, completing_turns, runtime_for, simple_task, write_script
from tests.integration.test_invocations_ops import _receipt
from tests.outbox_support import waiting_task


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    db = Database.from_url(store_url)
    app = create_app(load_settings(database_url=store_url, home=tmp_path / "home"), db=db)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    db.dispose()


def completed_task(rt: Runtime, scripts: Path) -> str:
    task_id = simple_task(rt, scripts)
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
    return task_id


def test_the_plan_and_the_evidence_of_a_task(
    rt: Runtime, scripts: Path, client: TestClient
) -> None:
    task_id = completed_task(rt, scripts)
    plan = client.get(f"/api/v1/tasks/{task_id}/plan")
    assert plan.status_code == 200
    body = plan.json()
    assert body["plan"]["revision"] == 2
    assert body["plan"]["session_id"] == rt.tasks.get(task_id).session_id
    evidence = client.get(f"/api/v1/tasks/{task_id}/evidence").json()
    [record] = evidence["items"]
    assert evidence["next_cursor"] is None
    assert (record["source"], record["origin"], record["kind"]) == (
        "scada_sim",
        "synthetic",
        "data_source",
    )
    assert record["content_ref"].startswith("sha256:")
    assert len(record["params_digest"]) == 64
    assert body["plan"]["nodes"][0]["evidence_ids"] == [record["evidence_id"]]


def _wire(value: Any) -> Any:
    """What a service's dict is on the wire: as pydantic serializes `Any` (a string as is), but
    every time as `wire_time` (`...+00:00`, six fraction digits), the one form the API sends."""
    return to_jsonable_python(_iso_times(value))


def _iso_times(value: Any) -> Any:
    if isinstance(value, datetime):
        return wire_time(value)
    if isinstance(value, dict):
        return {key: _iso_times(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_iso_times(item) for item in value]
    return value


def test_the_typed_routes_send_what_they_always_sent(
    rt: Runtime, scripts: Path, client: TestClient
) -> None:
    """The response models change the OpenAPI document, not the bodies: same keys (a node's
    absent `action_id` stays absent), same values, same time text."""
    task_id = completed_task(rt, scripts)
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    records = TaskRecords(rt.db)
    history = rt.plans.history(session_id)
    assert "action_id" not in history["latest"]["nodes"][1]
    invocation_id = _receipt(rt.db, "alice", session_id, "k1")
    receipt = ReceiptLedger(rt.db).get(invocation_id)
    assert receipt is not None
    plans = f"/api/v1/sessions/{session_id}/execution-plans"
    expected = {
        f"/api/v1/tasks/{task_id}/plan": records.plan(task_id),
        f"/api/v1/tasks/{task_id}/evidence": records.evidence(task_id),
        plans: history,
        f"{plans}/1": rt.plans.revision(session_id, 1).to_dict(),
        f"{plans}/2": rt.plans.revision(session_id, 2).to_dict(),
        f"/api/v1/invocations/{invocation_id}": receipt.public(),
    }
    for path, before in expected.items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.json() == _wire(before), path
    explain, view = client.get(f"/api/v1/tasks/{task_id}").json(), rt.tasks.explain(task_id)
    assert explain["token_usage"]["generations"], explain["token_usage"]
    for field in ("token_usage", "unknown_receipts", "running_receipts", "resolutions"):
        assert explain[field] == _wire(view[field]), field
    transcript = client.get(f"/api/v1/tasks/{task_id}/transcript").json()
    assert transcript["token_usage"] == _wire(view["token_usage"])


def test_the_explain_view_sends_what_it_always_sent(
    rt: Runtime, scripts: Path, tmp_path: Path, client: TestClient
) -> None:
    """Every key of `GET /api/v1/tasks/{id}`, nested ones included, is the service's: absent
    keys stay absent (a node's `action_id`), nulls stay null, times are `wire_time` text. Over a
    completed task (plan, report with findings) and a waiting one (a pending action, webhooks
    not yet delivered, and a recovery snapshot with a done and an unknown call)."""
    turns = completing_turns()
    report = turns[3]["tool_calls"][0]["arguments"]
    report["findings"] = ["plain text", {"text": "cited", "evidence_ids": [CITED]}]
    write_script(scripts, "reported", turns)
    done = rt.tasks.trigger(Trigger(task_type="reported", title="t")).task.task_id
    assert rt.executions.run(done, 1, worker="w1").outcome == "completed"
    waiting, _ = waiting_task(rt, tmp_path)
    plan = rt.tasks.explain(waiting)["plan"]
    session_id = rt.tasks.explain(waiting)["executions"][0]["session_id"]
    calls = [
        CallRecord("a", "read_task_context", {}, 1, "succeeded", None),
        CallRecord("b", "call_api", {"path": "/pumps/7", "token": "[redacted]"}, 2),
    ]
    snapshot = Snapshot.from_calls(calls, reason="lease lost", generation=1, last_plan=plan)
    with rt.db.transaction() as conn:
        snapshot_store.save_snapshot(conn, session_id, snapshot)
    for task_id in (done, waiting):
        view = rt.tasks.explain(task_id)
        response = client.get(f"/api/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        assert response.json() == _wire(view), task_id
    view = rt.tasks.explain(done)
    assert "action_id" not in view["plan"]["nodes"][0]
    assert len(view["report"]["findings"][1]["evidence_ids"]) == 1
    view = rt.tasks.explain(waiting)
    assert view["pending_actions"]
    assert view["deliveries"]["undelivered"]
    assert [len(view["recovery"][part]) for part in ("done", "unknown")] == [1, 1]
    assert view["recovery"]["last_plan"]["nodes"][0]["action_id"]


def test_an_unknown_task_is_a_404_envelope(client: TestClient) -> None:
    for what in ("plan", "evidence"):
        response = client.get(f"/api/v1/tasks/nope/{what}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_the_cli_lists_the_evidence(rt: Runtime, scripts: Path, store_url: str) -> None:
    task_id = completed_task(rt, scripts)
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_DATABASE_URL"] = store_url

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ORCHESTRATOR, "tasks", "evidence", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = cli(task_id)
    assert listed.returncode == 0, listed.stderr
    assert "scada_sim" in listed.stdout
    assert "synthetic" in listed.stdout
    (record,) = TaskRecords(rt.db).evidence(task_id)["items"]
    assert f"\n    {record['summary']}\n" in listed.stdout  # what it came from, under its line
    as_json = json.loads(cli(task_id, "--json").stdout)
    assert [item["origin"] for item in as_json] == ["synthetic"]
    missing = cli("nope")
    assert missing.returncode == 1
    assert len(missing.stderr.strip().splitlines()) == 1
