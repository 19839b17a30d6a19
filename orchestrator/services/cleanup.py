"""Retention of invocation receipts (seed 000, DESIGN invariant 20).

Finished receipts (`succeeded`, `failed`, `pending`) that belong to a session go with it (the
foreign key cascades). Orphans, with no session, are deleted in batches once older than
`ORCH_RETENTION_DAYS`. `running` and `unknown` are recovery boundaries and are never deleted for
age. `DATA_CLEANUP_ENABLE=false` or a retention of 0 disables cleanup altogether.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger

__all__ = ["CleanupReport", "run_cleanup"]


@dataclass(frozen=True)
class CleanupReport:
    """What one cleanup pass deleted (or why it deleted nothing)."""

    enabled: bool
    reason: str
    retention_days: int
    receipts_deleted: int
    batches: int
    cutoff: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "reason": self.reason,
            "retention_days": self.retention_days,
            "deleted": {"invocation_receipts": self.receipts_deleted},
            "batches": self.batches,
            "cutoff": self.cutoff.isoformat() if self.cutoff else None,
        }


def run_cleanup(
    db: Database,
    settings: Settings,
    *,
    now: datetime | None = None,
    batch_size: int = 500,
) -> CleanupReport:
    """One retention pass; the CLI `orchestrator cleanup` and the periodic Celery task call it."""
    result = ReceiptLedger(db).delete_orphans(
        retention_days=settings.retention_days,
        enabled=settings.data_cleanup_enable,
        batch_size=batch_size,
        now=now,
    )
    return CleanupReport(
        enabled=result.enabled,
        reason=result.reason,
        retention_days=settings.retention_days,
        receipts_deleted=result.deleted,
        batches=result.batches,
        cutoff=result.cutoff,
    )
