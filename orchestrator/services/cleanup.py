"""Retention of invocation receipts (seed 000, DESIGN invariant 20).

Finished receipts (`succeeded`, `failed`, `pending`) go with their session
(`ReceiptLedger.delete_session`). Sessions of background executions are never deleted, so their
finished receipts follow the retention period instead: once the task is finished and both it and
the receipt are older than `ORCH_RETENTION_DAYS`, they are deleted in batches, like orphans (no
session). `running` and `unknown` are recovery boundaries and are never deleted for age (when a
session is deleted they become orphans). `DATA_CLEANUP_ENABLE=false` or a retention of 0
disables cleanup altogether. Transcripts and recovery snapshots of finished tasks follow the
same retention as their receipts (a chat's go with its session).

The outbox's webhooks follow the retention too, or the table grows with every task event for
ever: delivered ones, discarded ones (dead letters an operator settled by hand) and those never
attempted where nothing sends them (the rows a fleet without a webhook receiver writes for each
event). Whether anything sends them is read from the store, not from this process's settings:
a cleanup run from an operator's laptop without the fleet's ORCH_WEBHOOK_URL deleted events the
fleet would still deliver (its dispatcher away longer than the retention, say). So never
attempted webhooks go only while no webhook in the store was ever delivered, dead-lettered or
discarded after an attempt (one discarded while pending, before any, was never sent), nor is
pending after an attempt (a receiver failing every time, not yet dead; or a dead letter an
operator retried), and this process has no URL either, which each batch checks again as it
deletes (a dispatcher may send one meanwhile); retention keeps the newest delivered (or
discarded after an attempt) one whatever its age, so the store does not forget that its
webhooks are sent. A fleet that drops
its webhook receiver says so: `orchestrator cleanup --unsent-webhooks`. Dead letters and rows
still being retried stay until an operator deals with them (retries or discards them), and so
do approved actions (one per approval, which the action's delivery is read from):
`store.outbox_retention.delete_expired_webhooks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.domain.times import wire_time
from orchestrator.settings import Settings
from orchestrator.store import outbox_retention
from orchestrator.store import transcripts as transcript_store
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
    orphans_deleted: int = 0
    of_finished_tasks_deleted: int = 0
    transcript_entries_deleted: int = 0
    #: Webhooks deleted: delivered ones, and never attempted ones while no URL is set.
    webhooks_delivered_deleted: int = 0
    webhooks_never_sent_deleted: int = 0
    #: Whether never-attempted webhooks were in scope: not when this process has a webhook URL
    #: (its dispatcher sends them, however late), nor where webhooks were ever sent from the
    #: store (the fleet's dispatcher sends them), unless told (`--unsent-webhooks`).
    never_sent_in_scope: bool = False
    #: Why they were not: the reason, for the report's line.
    never_sent_kept: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "reason": self.reason,
            "retention_days": self.retention_days,
            "deleted": {"invocation_receipts": self.receipts_deleted},
            "receipts_deleted_by_scope": {
                "orphans": self.orphans_deleted,
                "of_finished_tasks": self.of_finished_tasks_deleted,
            },
            "transcript_entries_deleted": self.transcript_entries_deleted,
            "outbox_webhooks_deleted": {
                "delivered": self.webhooks_delivered_deleted,
                "never_sent": self.webhooks_never_sent_deleted,
                "never_sent_in_scope": self.never_sent_in_scope,
                "never_sent_kept": self.never_sent_kept,
            },
            "batches": self.batches,
            "cutoff": wire_time(self.cutoff) if self.cutoff else None,
        }


def run_cleanup(
    db: Database,
    settings: Settings,
    *,
    now: datetime | None = None,
    batch_size: int = 500,
    unsent_webhooks: bool = False,
) -> CleanupReport:
    """One retention pass; the CLI `orchestrator cleanup` and the periodic Celery task call it.
    `unsent_webhooks`: an operator says the fleet has no webhook receiver (any more), so never
    attempted webhooks go even where earlier ones were sent (never where this process has a
    webhook URL)."""
    result = ReceiptLedger(db).delete_expired(
        retention_days=settings.retention_days,
        enabled=settings.data_cleanup_enable,
        batch_size=batch_size,
        now=now,
    )
    transcripts = delivered = never_sent = 0
    kept: str | None = _why_unsent_kept(db, settings, unsent_webhooks)
    if result.enabled and result.cutoff is not None:
        # Transcripts and recovery snapshots of finished tasks follow the same retention.
        while True:
            with db.transaction() as conn:
                deleted = transcript_store.delete_expired_batch(conn, result.cutoff, batch_size)
            transcripts += deleted
            if deleted < batch_size:
                break
        delivered, never_sent = _delete_webhooks(
            db, result.cutoff, batch_size, kept is None, told=unsent_webhooks
        )
    return CleanupReport(
        enabled=result.enabled,
        reason=result.reason,
        retention_days=settings.retention_days,
        receipts_deleted=result.deleted,
        batches=result.batches,
        cutoff=result.cutoff,
        orphans_deleted=result.orphans,
        of_finished_tasks_deleted=result.of_finished_tasks,
        transcript_entries_deleted=transcripts,
        webhooks_delivered_deleted=delivered,
        webhooks_never_sent_deleted=never_sent,
        never_sent_in_scope=kept is None,
        never_sent_kept=kept,
    )


def _why_unsent_kept(db: Database, settings: Settings, told: bool) -> str | None:
    """Why never-attempted webhooks are not for this cleanup, or None when they are: nothing
    sends them. Read before anything is deleted (the delivered rows are the evidence)."""
    if settings.webhook_url:
        return "ORCH_WEBHOOK_URL is set"  # this process's dispatcher sends them, however late
    if told or not settings.data_cleanup_enable or settings.retention_days <= 0:
        return None
    with db.transaction(readonly=True) as conn:
        sent = outbox_retention.webhooks_were_sent(conn)
    if sent:
        return (
            "webhooks were sent from this store: the fleet's ORCH_WEBHOOK_URL sends them; "
            "`orchestrator cleanup --unsent-webhooks` once the fleet has none"
        )
    return None


def _delete_webhooks(
    db: Database, cutoff: datetime, batch_size: int, never_sent: bool, *, told: bool
) -> tuple[int, int]:
    """The outbox's expired webhooks, one short transaction a batch (a table of millions never
    holds one long delete that the dispatcher's claims wait on); `never_sent`: those never
    attempted too (nothing sends them)."""
    with db.transaction(readonly=True) as conn:
        keep = outbox_retention.newest_sent_webhook(conn)  # the store's record that they are sent
    delivered = unsent = 0
    while True:
        with db.transaction() as conn:
            done, dropped = outbox_retention.delete_expired_webhooks(
                conn, cutoff, batch_size, never_sent=never_sent, keep=keep, told=told
            )
        delivered += done
        unsent += dropped
        if done + dropped < batch_size:
            return delivered, unsent
