"""The periodic Celery cleanup task: its body runs the retention pass of the worker's settings."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from orchestrator.domain.fingerprints import fingerprint
from orchestrator.settings import get_settings
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.tables import invocation_receipts, tasks
from orchestrator.store.types import utcnow
from tests.integration.receipt_rows import running_task
from workers import tasks as worker_tasks

DIGEST = fingerprint({"a": 1})


@pytest.fixture
def worker_env(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.MonkeyPatch]:
    """The worker process's settings point at this test's store; its runtime is rebuilt."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    monkeypatch.delenv("ORCH_REDIS_URL", raising=False)
    monkeypatch.setenv("ORCH_RETENTION_DAYS", "30")
    get_settings.cache_clear()
    monkeypatch.setattr(worker_tasks, "_runtime", None)
    yield monkeypatch
    if worker_tasks._runtime is not None:
        worker_tasks._runtime[1].close()
    monkeypatch.setattr(worker_tasks, "_runtime", None)
    get_settings.cache_clear()


def _receipt(db: Database, owner: str, session_id: str | None, key: str, status: str) -> str:
    ledger = ReceiptLedger(db)
    claim = ledger.claim(
        owner=owner,
        session_id=session_id,
        tool_name="call_api",
        identity_key=key,
        args_digest=DIGEST,
    )
    if status != "running":
        ledger.finish(
            claim.receipt.invocation_id, claim.receipt.claim_token, status=status, summary="s"
        )
    with db.transaction() as conn:
        conn.execute(
            update(invocation_receipts)
            .where(invocation_receipts.c.invocation_id == claim.receipt.invocation_id)
            .values(updated_at=utcnow() - timedelta(days=90))
        )
    return claim.receipt.invocation_id


@pytest.mark.parametrize("enable", ["true", "false"])
def test_the_cleanup_task_deletes_expired_finished_receipts(
    db: Database, worker_env: pytest.MonkeyPatch, enable: str
) -> None:
    worker_env.setenv("DATA_CLEANUP_ENABLE", enable)
    task_id, session_id, _ = running_task(db)
    with db.transaction() as conn:
        conn.execute(
            update(tasks)
            .where(tasks.c.task_id == task_id)
            .values(status="completed", updated_at=utcnow() - timedelta(days=60))
        )
    owner = f"task:{task_id}"
    expired = [
        _receipt(db, "background", None, "orphan", "succeeded"),
        _receipt(db, owner, session_id, "done", "succeeded"),
        _receipt(db, owner, session_id, "submitted", "pending"),
    ]
    kept = [
        _receipt(db, owner, session_id, "in-doubt", "running"),
        _receipt(db, "background", None, "orphan-in-doubt", "running"),
    ]
    ReceiptLedger(db).cold_start()  # the running ones are unknown now, and still kept

    report = worker_tasks.cleanup()

    ledger = ReceiptLedger(db)
    if enable == "true":
        assert report["enabled"] is True
        assert report["deleted"] == {"invocation_receipts": 3}
        assert report["receipts_deleted_by_scope"] == {"orphans": 1, "of_finished_tasks": 2}
        assert all(ledger.get(invocation_id) is None for invocation_id in expired)
    else:
        assert report["enabled"] is False
        assert report["deleted"] == {"invocation_receipts": 0}
        assert all(ledger.get(invocation_id) is not None for invocation_id in expired)
    for invocation_id in kept:
        receipt = ledger.get(invocation_id)
        assert receipt is not None
        assert receipt.status == "unknown"
