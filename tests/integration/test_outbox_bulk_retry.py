"""After a backend refused every delivery (a secret rotated on one side only: 401 for all), the
operator mends it and makes every dead letter due again in one command, not one per row.

Both stores, a real HTTP backend on loopback, the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher, OutboxService
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as runtime:
        yield runtime


def test_every_dead_letter_is_retried_in_one_command_once_the_backend_is_mended(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    tasks = [waiting_task(rt, tmp_path)[0] for _ in range(3)]
    backend.always_fail, backend.fail_status = True, 401
    sender = OutboxDispatcher(rt.settings, rt.db)
    try:
        sender.run_once()
        assert len(OutboxService(rt.db).list(status="dead")) == 3  # one per task, at once
        monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
        monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
        for wrong in (["outbox", "retry"], ["outbox", "retry", "1", "--all-dead"]):
            assert main(wrong) == 2
            assert "give one OUTBOX_ID, or --all-dead" in capsys.readouterr().err
        assert main(["outbox", "retry", "1", "--kind", "webhook"]) == 2
        assert "--kind and --task go with --all-dead" in capsys.readouterr().err
        backend.always_fail = False  # the secret is mended
        assert main(["outbox", "retry", "--all-dead", "--task", tasks[0], "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"retried": 1}
        assert main(["outbox", "retry", "--all-dead", "--kind", "action"]) == 0
        assert capsys.readouterr().out.strip() == "0 dead-lettered deliveries are due again"
        assert main(["outbox", "retry", "--all-dead", "--kind", "webhook"]) == 0
        assert capsys.readouterr().out.strip() == "2 dead-lettered deliveries are due again"
        pending = OutboxService(rt.db).list(status="pending")
        assert {(r.attempts, r.throttled) for r in pending} == {(0, 0)}  # fresh counts
        for _ in range(3):
            sender.run_once()
    finally:
        sender.close()
    assert OutboxService(rt.db).list(status="dead") == []
    assert OutboxService(rt.db).list(status="pending") == []
    assert {h.body["task_id"] for h in backend.on("/hooks") if h.body["seq"] == 4} == set(tasks)


def test_the_api_retries_every_dead_letter_for_an_operator_not_a_viewer(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """`POST /api/v1/outbox/retry-dead` (what the console's button sends): a viewer is refused,
    an operator makes every dead letter of the kind or task due again, with fresh counts."""
    from fastapi.testclient import TestClient

    from orchestrator.api.app import create_app
    from tests.integration.test_operator_accounts import TOKENS, bearer, operators_file

    tasks = [waiting_task(rt, tmp_path)[0] for _ in range(2)]
    backend.always_fail, backend.fail_status = True, 401
    sender = OutboxDispatcher(rt.settings, rt.db)
    try:
        sender.run_once()
    finally:
        sender.close()
    assert len(OutboxService(rt.db).list(status="dead")) == 2
    settings = rt.settings.model_copy(update={"operators": operators_file(tmp_path)})
    with TestClient(create_app(settings, db=rt.db)) as api:
        path = "/api/v1/outbox/retry-dead"
        refused = api.post(path, json={}, headers=bearer(TOKENS["vera"]))
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
        bad = api.post(path, json={"kind": "email"}, headers=bearer(TOKENS["otto"]))
        assert bad.status_code == 422
        one = api.post(path, json={"task_id": tasks[0]}, headers=bearer(TOKENS["otto"]))
        assert (one.status_code, one.json()) == (200, {"retried": 1})
        rest = api.post(path, headers=bearer(TOKENS["otto"]))  # no body: every dead letter
        assert rest.json() == {"retried": 1}
    assert OutboxService(rt.db).list(status="dead") == []
    assert {(r.attempts, r.throttled) for r in OutboxService(rt.db).list(status="pending")} == {
        (0, 0)
    }
