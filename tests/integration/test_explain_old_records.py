"""The explain view (`GET /api/v1/tasks/{id}`, `orchestrator tasks show`) over records an older
version stored: a part of another shape is shown as its JSON text, never a 500 or a failed
command, so an operator investigating an old task still sees the rest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.settings import load_settings
from orchestrator.store.db import Database
from orchestrator.store.tables import recovery_snapshots, task_events
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for, simple_task

DONE = {"call_id": "a", "tool": "read_task_context", "turn": 1, "status": "succeeded"}
DONE_SENT = {**DONE, "invocation_id": None}
ODD_STATUS = {**DONE_SENT, "call_id": "b", "status": "cancelled"}  # not a result status now


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


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@pytest.fixture
def old_task(rt: Runtime, scripts: Path) -> str:
    """A completed task whose generation left a snapshot of older, unexpected shapes."""
    task_id = simple_task(rt, scripts)
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
    session_id = rt.tasks.get(task_id).session_id
    with rt.db.transaction() as conn:
        conn.execute(
            insert(recovery_snapshots).values(
                session_id=session_id,
                messages=[],
                receipts=[DONE_SENT, ODD_STATUS, {"call_id": "c"}, None, 7],
                unknown_calls={"call_id": "d", "tool": "call_api"},  # one call, not a list
                summary={"reason": "lease lost", "generation": [1], "last_plan": {"nodes": 3}},
                updated_at=utcnow(),
            )
        )
        seq = conn.execute(select(func.max(task_events.c.seq))).scalar_one()
        conn.execute(
            insert(task_events).values(
                task_id=task_id,
                seq=seq + 1,
                type="invocation_resolved",
                generation=1,
                status="completed",
                data=OLD_RESOLUTION,  # no tool, by or note; a status no longer known
                created_at=utcnow(),
            )
        )
    return task_id


OLD_RESOLUTION = {"invocation_id": "i1", "previous_status": "lost", "resolved_status": "failed"}


EXPECTED_DONE = [DONE_SENT, _text(ODD_STATUS), _text({"call_id": "c"}), "null", "7"]


def test_an_older_recovery_snapshot_is_shown_degraded_not_a_500(
    old_task: str, client: TestClient
) -> None:
    response = client.get(f"/api/v1/tasks/{old_task}")
    assert response.status_code == 200, response.text
    recovery = response.json()["recovery"]
    assert recovery["done"] == EXPECTED_DONE
    assert recovery["unknown"] == [_text({"call_id": "d", "tool": "call_api"})]
    assert recovery["generation"] == "[1]"
    # The plan is the task's as it stands now, not the one the snapshot stored (people may
    # have closed steps in it since): the stored one, of whatever shape, is not shown.
    assert recovery["last_plan"] == response.json()["plan"]
    assert recovery["reason"] == "lease lost"
    assert recovery["verify_first"]  # something is unknown: verify it first
    [resolution] = response.json()["resolutions"]
    assert json.loads(resolution)["previous_status"] == "lost"
    assert json.loads(resolution)["by"] is None


def test_the_cli_shows_the_same_degraded_snapshot(
    old_task: str,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    client: TestClient,
) -> None:
    from orchestrator.cli import main

    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    assert main(["tasks", "show", old_task]) == 0
    shown = capsys.readouterr().out
    assert "recovery snapshot of generation [1]: 5 call(s) returned, 1 unknown" in shown
    assert 'unknown: {"call_id": "d", "tool": "call_api"} (verify read-only first)' in shown
    assert '    {"at": ' in shown  # the resolution, as its JSON text
    assert main(["tasks", "show", old_task, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    sent = client.get(f"/api/v1/tasks/{old_task}").json()
    for part in ("recovery", "resolutions"):
        assert printed[part] == sent[part], part
