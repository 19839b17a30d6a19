"""Deleting a chat or a collaboration session.

Seed 000: 成功、失败和已确认提交的回执随会话删除回收.

Before, nothing could delete a session, so "receipts go with their session" held only in the
ledger's own tests: a chat's plans, messages and finished receipts stayed for ever.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from orchestrator.api import create_app
from orchestrator.events import NullNotifier
from orchestrator.services.plans import PlanService
from orchestrator.settings import load_settings
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.tables import invocation_receipts, plan_revisions
from tests.integration.receipt_rows import claim_arguments
from tests.integration.test_plan_events import plan_body

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKENS = {"alma": "alma-token", "otto": "otto-token", "vera": "vera-token"}
ROLES = {"alma": "approver", "otto": "operator", "vera": "viewer"}


@pytest.fixture
def api(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Database]]:
    operators = tmp_path / "operators"
    operators.write_text(
        "".join(
            f"{name} {ROLES[name]} {hashlib.sha256(token.encode()).hexdigest()}\n"
            for name, token in TOKENS.items()
        ),
        encoding="utf-8",
    )
    settings = load_settings(database_url=store_url, home=tmp_path, operators=operators)
    db = Database.from_url(store_url)
    with TestClient(create_app(settings)) as client:
        yield client, db
    db.dispose()


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def test_a_chat_goes_with_its_plans_and_finished_receipts_running_ones_stay(
    api: tuple[TestClient, Database],
) -> None:
    client, db = api
    made = client.post(
        "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "pumps"}, headers=as_("otto")
    )
    assert made.status_code == 201, made.text
    session_id = made.json()["session_id"]
    PlanService(db, NullNotifier()).publish_execution_plan(session_id, plan_body("r1"))
    assert client.get(f"/api/v1/sessions/{session_id}/execution-plans", headers=as_("otto")).json()
    ledger = ReceiptLedger(db)
    ids: dict[str, str] = {}
    for status in ("succeeded", "running", "unknown"):
        claim = ledger.claim(**claim_arguments(session_id, owner="otto", identity_key=status))
        if status == "succeeded":
            receipt = claim.receipt
            ledger.finish(receipt.invocation_id, receipt.claim_token, status=status, summary="s")
        ids[status] = claim.receipt.invocation_id
    with db.transaction() as conn:
        conn.execute(
            update(invocation_receipts)
            .where(invocation_receipts.c.invocation_id == ids["unknown"])
            .values(status="unknown")
        )
    # Another person's chat is not theirs to delete; a viewer deletes nothing.
    assert (
        client.delete(f"/api/v1/sessions/{session_id}", headers=as_("alma")).json()["error"]["code"]
        == "not_session_owner"
    )
    assert client.delete(f"/api/v1/sessions/{session_id}", headers=as_("vera")).status_code == 403

    gone = client.delete(f"/api/v1/sessions/{session_id}", headers=as_("otto"))
    assert gone.status_code == 200, gone.text
    assert gone.json() == {"session_id": session_id, "receipts_deleted": 1}
    assert client.get(f"/api/v1/sessions/{session_id}", headers=as_("otto")).status_code == 404
    plans = client.get(f"/api/v1/sessions/{session_id}/execution-plans", headers=as_("otto"))
    assert plans.status_code == 404
    with db.transaction(readonly=True) as conn:
        assert (
            conn.execute(
                select(func.count())
                .select_from(plan_revisions)
                .where(plan_revisions.c.session_id == session_id)
            ).scalar_one()
            == 0
        )
    assert ledger.get(ids["succeeded"]) is None
    for status in ("running", "unknown"):  # recovery boundaries: orphans, never deleted
        kept = ledger.get(ids[status])
        assert kept is not None
        assert (kept.session_id, kept.status) == (None, status)
    again = client.delete(f"/api/v1/sessions/{session_id}", headers=as_("otto"))
    assert again.status_code == 404


def _new_task(client: TestClient, title: str) -> dict[str, Any]:
    """A task triggered through the API by otto (an operator)."""
    answer = client.post(
        "/api/v1/tasks", json={"task_type": "t", "title": title, "context": {}}, headers=as_("otto")
    )
    task: dict[str, Any] = answer.json()
    return task


def test_an_execution_session_is_the_task_s_record_and_is_not_deleted(
    api: tuple[TestClient, Database],
) -> None:
    client, _ = api
    task = _new_task(client, "Pressure drop")
    refused = client.delete(f"/api/v1/sessions/{task['session_id']}", headers=as_("alma"))
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "execution_session"
    assert (
        client.get(f"/api/v1/sessions/{task['session_id']}", headers=as_("alma")).status_code == 200
    )


def test_a_collaboration_session_can_be_deleted_and_opened_anew(
    api: tuple[TestClient, Database],
) -> None:
    client, _ = api
    task = _new_task(client, "Turbid water")
    first = client.post(f"/api/v1/tasks/{task['task_id']}/collaboration", headers=as_("otto"))
    assert first.status_code == 201
    session_id = first.json()["session_id"]
    assert client.delete(f"/api/v1/sessions/{session_id}", headers=as_("otto")).status_code == 200
    anew = client.post(f"/api/v1/tasks/{task['task_id']}/collaboration", headers=as_("otto"))
    assert anew.status_code == 201
    assert anew.json()["session_id"] != session_id
