"""A generation handed back by its worker (here: a model server rate limiting the round past its
retries) leaves the task `running` until the sweeper requeues it, minutes later, while nothing
runs. The operator sees that, why and until when: `handed_back` in the task list and the
task's view (API and CLI), and a count in /metrics; once requeued, it is gone. Both stores,
the real OpenAI client against the loopback server."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.store import executions as execution_store
from orchestrator.store.types import utcnow
from tests.openai_server import OpenAIServer
from tests.transcript_support import openai_runtime, trigger

REASON = "handed back: the model server is rate limiting (HTTP 429: slow down)"


def _gauge(text: str, name: str) -> float:
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(f"{name} ")]
    assert len(values) == 1, text
    return float(values[0])


def test_a_handed_back_task_says_it_waits_why_and_until_when_then_no_more(
    store_url: str,
    scripts: Path,
    server: OpenAIServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rt = openai_runtime(store_url, scripts, server)  # LLM_MAX_RETRIES=1
    try:
        server.fail(429, retry_after=120, message="slow down")
        server.fail(429, retry_after=120, message="slow down")
        waiting_id = trigger(rt)
        assert rt.executions.run(waiting_id, 1, worker="w1").give_back
        other_id = trigger(rt)  # queued, never run: nothing to say about it
        with rt.db.transaction(readonly=True) as conn:
            first = execution_store.get_execution(conn, waiting_id, 1)
        assert first is not None
        assert first.lease_expires_at is not None

        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            listed = {t["task_id"]: t for t in client.get("/api/v1/tasks").json()["items"]}
            shown = client.get(f"/api/v1/tasks/{waiting_id}").json()
            metrics = client.get("/metrics").text
        for view in (listed[waiting_id], shown):
            assert view["status"] == "running"  # the documented status keeps its meaning
            wait = view["handed_back"]
            assert wait is not None, view
            assert wait["reason"].startswith(REASON)
            assert wait["at"] == first.handed_back_at.isoformat(timespec="microseconds")
            assert wait["requeue_after"] == first.lease_expires_at.isoformat(
                timespec="microseconds"
            )
        assert listed[other_id]["handed_back"] is None
        assert _gauge(metrics, "orchestrator_tasks_handed_back") == 1.0

        monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
        monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
        assert main(["tasks", "list"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if waiting_id in line)
        after = first.lease_expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert row.endswith(f"  [handed back, requeued after {after}]")
        assert main(["tasks", "show", waiting_id]) == 0
        page = capsys.readouterr().out
        assert "  handed back at " in page
        assert ": the model server is rate limiting (HTTP 429: slow down)" in page
        assert "      1  handed-back  w1 " in page
        assert f"requeued at the first sweep after {first.lease_expires_at.isoformat()[:19]}" in (
            page
        )
        assert "sk-never-shown" not in page
        # A sweep now leaves it (its Retry-After has not passed), and says so.
        assert main(["recover"]) == 0
        assert capsys.readouterr().out.splitlines() == [
            "nothing to recover",
            "1 generation(s) handed back by their workers wait to be requeued (a model "
            "server's Retry-After or back-off: tasks list says until when; tasks requeue runs "
            "one now)",
        ]

        # The sweep past the Retry-After requeues it: nothing is handed back any more.
        swept = rt.sweeper.sweep(utcnow() + timedelta(seconds=130))
        assert swept.requeued == [(waiting_id, 1, 2)]
        assert main(["tasks", "list", "--json"]) == 0
        again = {t["task_id"]: t for t in json.loads(capsys.readouterr().out)}
        assert again[waiting_id]["handed_back"] is None
        assert rt.tasks.explain(waiting_id)["handed_back"] is None
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            assert _gauge(client.get("/metrics").text, "orchestrator_tasks_handed_back") == 0.0
    finally:
        rt.close()
