"""The same trigger_id with another task type, title or context is refused: 409 trigger_conflict."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.api.tasks import get_task_service
from orchestrator.cli import main
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.settings import load_settings
from orchestrator.store.db import Database

FIRST = {
    "task_type": "water_quality",
    "title": "Brown water",
    "context": {"zone": 4, "tap": [1, 2]},
}


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    db = Database.from_url(store_url)
    app = create_app(load_settings(database_url=store_url, home=tmp_path / "home"), db=db)
    app.dependency_overrides[get_task_service] = lambda: TaskService(db, RecordingDispatcher())
    with TestClient(app) as test_client:
        yield test_client
    db.dispose()


@pytest.mark.parametrize(
    "change",
    [{"task_type": "leak"}, {"title": "Green water"}, {"context": {"zone": 5, "tap": [1, 2]}}],
)
def test_another_payload_under_the_same_trigger_id_is_a_conflict(
    client: TestClient, change: dict[str, Any]
) -> None:
    first = client.post("/api/v1/tasks", json=FIRST | {"trigger_id": "k-1"})
    assert first.status_code == 201
    # The same payload (keys in another order) is the same trigger: 200 and the same task.
    same = client.post(
        "/api/v1/tasks",
        json={
            "context": {"tap": [1, 2], "zone": 4},
            "title": "Brown water",
            "task_type": "water_quality",
            "trigger_id": "k-1",
        },
    )
    assert (same.status_code, same.json()["task_id"]) == (200, first.json()["task_id"])
    other = client.post("/api/v1/tasks", json=FIRST | change | {"trigger_id": "k-1"})
    assert other.status_code == 409
    error = other.json()["error"]
    assert error["code"] == "trigger_conflict"
    assert [d["field"] for d in error["details"]] == list(change)
    assert len(client.get("/api/v1/tasks").json()["items"]) == 1


def test_the_cli_refuses_it_too(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    context = tmp_path / "context.json"
    context.write_text(json.dumps({"zone": 4}), encoding="utf-8")
    base = [
        "tasks",
        "trigger",
        "--type",
        "leak",
        "--trigger-id",
        "k-2",
        "--context-file",
        str(context),
    ]
    assert main([*base, "--title", "Leak"]) == 0
    assert main([*base, "--title", "Leak"]) == 0
    capsys.readouterr()
    assert main([*base, "--title", "Another leak"]) == 1
    assert "trigger_conflict" in capsys.readouterr().err


def test_a_trigger_stores_its_context_and_sample_as_given(store_url: str) -> None:
    """The trigger's one statement (Postgres) or three (SQLite): every column as sent, once."""
    db = Database.from_url(store_url)
    try:
        service = TaskService(db, RecordingDispatcher())
        context = {"站点": "泵站 3", "readings": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}}
        sample = {"turbidity_ntu": 4.2, "note": "naïve ☃"}
        sent = Trigger(
            task_type="water_quality",
            title="Brown water",
            context=context,
            sample_input=sample,
            trigger_id="backend:42",
        )
        first = service.trigger(sent)
        again = service.trigger(sent)
        assert (first.created, again.created) == (True, False)
        assert again.task.task_id == first.task.task_id
        stored = service.get(first.task.task_id)
        assert (stored.context, stored.sample_input) == (context, sample)
        assert (stored.status, stored.generation) == ("queued", 1)
        assert stored.origin == "peripheral_sample"
        assert stored.created_at == first.task.created_at
        view = service.explain(first.task.task_id)
        assert [(e["generation"], e["outcome"]) for e in view["executions"]] == [(1, None)]
    finally:
        db.dispose()
