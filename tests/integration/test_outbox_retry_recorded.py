"""An operator's retry is recorded on the row: who, when, and a note.

A discard kept who, when and why; a retry none of it, so a dead letter made due again (or a
failing delivery hurried) did not say who did it. Both stores, a real HTTP backend on loopback,
the API's routes (an operator account, the shared token with and without `by`) and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from tests.integration.test_operator_accounts import bearer, operators_file
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


def test_a_retry_records_who_when_and_why(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    dispatcher = OutboxDispatcher(rt.settings, rt.db)
    settings = rt.settings.model_copy(
        update={"operators": operators_file(tmp_path), "api_token": "shared-token"}
    )
    try:
        backend.always_fail = True
        dispatcher.run_once()
        [row] = [r for r in OutboxService(rt.db).list(task_id=task_id) if r.attempts]
        number = str(row.outbox_id)
        assert (row.status, row.retried_by, row.retried_at) == ("pending", None, None)

        monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
        monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
        assert main(["outbox", "retry", number, "--note", "x" * 501]) == 2
        assert "invalid --note" in capsys.readouterr().err
        assert main(["outbox", "retry", number, "--by", "kim", "--note", "backend mended"]) == 0
        capsys.readouterr()
        assert main(["outbox", "show", number, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["retried_by"], shown["retry_note"]) == ("kim", "backend mended")
        assert shown["retried_at"] is not None
        assert main(["outbox", "show", number]) == 0
        text = capsys.readouterr().out
        assert f"  retried by kim at {shown['retried_at'][:19]}" in text
        assert text.count(": backend mended\n") == 1
        # Due now: not offered a retry that would change nothing, only the way out.
        assert "outbox retry" not in text
        assert f"`orchestrator outbox discard {number} --reason R`" in text

        with TestClient(create_app(settings, db=rt.db)) as client:
            route = f"/api/v1/outbox/{number}/retry"
            # An account is recorded by its name, whatever `by` it sends.
            otto = client.post(route, json={"by": "someone"}, headers=bearer("operator-token"))
            assert otto.status_code == 200, otto.text
            assert (otto.json()["retried_by"], otto.json()["retry_note"]) == ("otto", None)
            shared = client.post(
                route,
                json={"by": "sam", "note": "after the deploy"},
                headers=bearer("shared-token"),
            )
            assert (shared.json()["retried_by"], shared.json()["retry_note"]) == (
                "sam",
                "after the deploy",
            )
            # No body (the console's retry): the shared token's account.
            bare = client.post(route, headers=bearer("shared-token"))
            assert bare.json()["retried_by"] == "api"
            assert (
                client.get(f"/api/v1/outbox/{number}", headers=bearer("viewer-token")).json()[
                    "retried_by"
                ]
                == "api"
            )

            backend.always_fail, backend.answers = False, [422]  # refused for good: dead
            dispatcher.run_once()
            assert OutboxService(rt.db).shown(int(number))["status"] == "dead"
            every = client.post(
                "/api/v1/outbox/retry-dead",
                json={"task_id": task_id, "note": "payload fixed"},
                headers=bearer("operator-token"),
            )
            assert every.json() == {"retried": 1}
        again = OutboxService(rt.db).shown(int(number))
        assert (again["status"], again["retried_by"], again["retry_note"]) == (
            "pending",
            "otto",
            "payload fixed",
        )
    finally:
        dispatcher.close()


def test_a_retry_stored_without_a_name_says_so(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A retry whose row keeps no name (`retried_by` NULL: written by hand, or by a tool that
    gave none) read `retried by  at T` in `outbox show` and nothing at all in `tasks show`."""
    from sqlalchemy import update

    from orchestrator.cli import main
    from orchestrator.store.tables import outbox

    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail = True
    OutboxDispatcher(rt.settings, rt.db).run_once()
    [row] = [r for r in OutboxService(rt.db).list(task_id=task_id) if r.attempts]
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    assert main(["outbox", "retry", str(row.outbox_id), "--by", "kim"]) == 0
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox).where(outbox.c.outbox_id == row.outbox_id).values(retried_by=None)
        )
    capsys.readouterr()
    assert main(["outbox", "show", str(row.outbox_id)]) == 0
    assert "  retried by an unrecorded name at " in capsys.readouterr().out
    assert main(["tasks", "show", task_id]) == 0
    assert "; retried by an unrecorded name at " in capsys.readouterr().out
