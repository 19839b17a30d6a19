"""`orchestrator sweeper` runs the retention pass (DESIGN invariant 20), at start and hourly.

The fleet the README and docker-compose.yml describe runs `orchestrator worker` (no `--beat`)
and `orchestrator sweeper`; only `worker --beat` ran the hourly cleanup, so with that fleet
expired receipts and transcripts were never deleted while `DATA_CLEANUP_ENABLE` said they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from orchestrator.domain.fingerprints import fingerprint
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.tables import invocation_receipts
from orchestrator.store.types import utcnow
from tests.acceptance.fleet import Fleet, fleet_env, running_fleet
from tests.executions_support import wait_for


@pytest.fixture
def pg(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url)
    yield database
    database.dispose()


def _expired_orphan(db: Database, key: str, status: str = "succeeded") -> str:
    """A receipt of no session, finished (or not) 90 days ago."""
    ledger = ReceiptLedger(db)
    claim = ledger.claim(
        owner="background",
        session_id=None,
        tool_name="call_api",
        identity_key=key,
        args_digest=fingerprint({"k": key}),
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


def _exists(db: Database, invocation_id: str) -> bool:
    with db.transaction(readonly=True) as conn:
        found = conn.execute(
            select(invocation_receipts.c.invocation_id).where(
                invocation_receipts.c.invocation_id == invocation_id
            )
        ).first()
    return found is not None


@pytest.mark.slow
@pytest.mark.parametrize("enable", ["true", "false"])
def test_the_sweeper_deletes_expired_receipts_unless_cleanup_is_disabled(
    pg_url: str, redis_url: str, tmp_path: Path, pg: Database, enable: str
) -> None:
    expired = _expired_orphan(pg, "old")
    unresolved = _expired_orphan(pg, "unknown", status="running")
    env = fleet_env(pg_url, redis_url, tmp_path) | {
        "ORCH_RETENTION_DAYS": "30",
        "DATA_CLEANUP_ENABLE": enable,
    }
    with running_fleet(env, tmp_path) as fleet:
        fleet.sweeper()
        wait_for(lambda: "cleanup: " in _log(fleet), 20, what="the sweeper's cleanup line")
        text = _log(fleet)
        if enable == "true":
            assert "deleted 1 invocation receipts older than 30 days" in text, text
            assert not _exists(pg, expired)
        else:
            assert "cleanup disabled: DATA_CLEANUP_ENABLE is false" in text, text
            assert _exists(pg, expired)
        assert _exists(pg, unresolved)  # a running receipt is never deleted for age


def _log(fleet: Fleet) -> str:
    return fleet.logs()
