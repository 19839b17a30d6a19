"""Operators' receipts: `invocations show`, `cleanup`, the invocations API, get_tool_execution."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from orchestrator.api import create_app
from orchestrator.cli import main
from orchestrator.domain.fingerprints import fingerprint
from orchestrator.settings import load_settings
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.tables import invocation_receipts
from orchestrator.store.types import utcnow
from orchestrator.tools.base import ToolContext
from orchestrator.tools.invocations import GetToolExecution, GetToolExecutionArgs
from tests.integration.receipt_rows import chat_session, running_task, supersede

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

DIGEST = fingerprint({"a": 1})


def _receipt(db: Database, owner: str, session_id: str | None, key: str) -> str:
    claim = ReceiptLedger(db).claim(
        owner=owner,
        session_id=session_id,
        tool_name="call_api",
        identity_key=key,
        args_digest=DIGEST,
    )
    return claim.receipt.invocation_id


@pytest.fixture
def env(store_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    return store_url


def test_invocations_show(db: Database, env: str, capsys: pytest.CaptureFixture[str]) -> None:
    invocation_id = _receipt(db, "alice", chat_session(db), "k1")
    assert main(["invocations", "show", invocation_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["invocation_id"] == invocation_id
    assert shown["status"] == "running"
    assert "claim_token" not in shown
    assert "args_digest" not in shown
    assert main(["invocations", "show", invocation_id]) == 0
    assert "running" in capsys.readouterr().out
    assert main(["invocations", "show", "nope"]) == 1


@pytest.mark.parametrize(
    ("enable", "days", "deleted"), [("true", "30", 1), ("true", "0", 0), ("false", "30", 0)]
)
def test_cleanup_command(
    db: Database,
    env: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    enable: str,
    days: str,
    deleted: int,
) -> None:
    ledger = ReceiptLedger(db)
    old = _receipt(db, "background", None, "k-old")
    receipt = ledger.get(old)
    assert receipt is not None
    ledger.finish(old, receipt.claim_token, status="succeeded", summary="s")
    with db.transaction() as conn:
        conn.execute(update(invocation_receipts).values(updated_at=utcnow() - timedelta(days=90)))
    monkeypatch.setenv("DATA_CLEANUP_ENABLE", enable)
    monkeypatch.setenv("ORCH_RETENTION_DAYS", days)
    assert main(["cleanup", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted"] == {"invocation_receipts": deleted}
    assert (ledger.get(old) is None) is bool(deleted)
    assert main(["cleanup"]) == 0
    assert "deleted" in capsys.readouterr().out


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(database_url=store_url, home=tmp_path, api_token="t", redis_url=None)
    # The default routers: the invocations API must be mounted in the real app.
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def test_invocations_api(db: Database, client: TestClient) -> None:
    invocation_id = _receipt(db, "alice", chat_session(db), "k1")
    headers = {"Authorization": "Bearer t"}
    response = client.get(f"/api/v1/invocations/{invocation_id}", headers=headers)
    assert response.status_code == 200
    assert response.json()["status"] == "running"
    assert "claim_token" not in response.json()
    missing = client.get("/api/v1/invocations/nope", headers=headers)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert client.get(f"/api/v1/invocations/{invocation_id}").status_code == 401


def test_get_tool_execution_sees_only_its_owner_and_scope(db: Database) -> None:
    ledger = ReceiptLedger(db)
    tool = GetToolExecution(ledger)
    chat = chat_session(db, "alice")
    other_chat = chat_session(db, "alice")
    mine = _receipt(db, "alice", chat, "k1")
    alice = ToolContext("alice", chat, "r1")
    assert tool.run(alice, GetToolExecutionArgs(invocation_id=mine)).status == "succeeded"
    # Same user, another chat session; another user: both see nothing.
    assert (
        tool.run(
            ToolContext("alice", other_chat, "r1"), GetToolExecutionArgs(invocation_id=mine)
        ).code
        == "not_found"
    )
    assert (
        tool.run(ToolContext("bob", chat, "r1"), GetToolExecutionArgs(invocation_id=mine)).code
        == "not_found"
    )
    # A task sees its receipts across generations and sessions.
    task_id, session_id, fence = running_task(db)
    owner = f"task:{task_id}"
    first = _receipt(db, owner, session_id, "k2")
    new_session, _ = supersede(db, fence)
    gen2 = ToolContext(owner, new_session, "g2", task_id=task_id, generation=2)
    seen = tool.run(gen2, GetToolExecutionArgs(invocation_id=first))
    assert seen.status == "succeeded"
    assert seen.payload["status"] == "running"
    assert "owner" not in seen.payload
