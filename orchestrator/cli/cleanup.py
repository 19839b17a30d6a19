"""`orchestrator cleanup`: one retention pass over the receipts, transcripts and outbox webhooks;
prints what it deleted."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import CommandFailed, add_json_flag, bounded_int, load, print_json

if TYPE_CHECKING:
    from orchestrator.services.cleanup import CleanupReport

__all__ = ["MAX_BATCH", "describe", "register"]

MAX_BATCH = 10_000


def register(commands: Any) -> None:
    cleanup = commands.add_parser(
        "cleanup",
        help="retention: delete expired receipts, transcripts of finished tasks and done-with "
        "outbox webhooks (never running or unknown receipts, nor dead-lettered deliveries)",
    )
    cleanup.add_argument(
        "--batch-size",
        type=bounded_int(1, MAX_BATCH),
        default=500,
        help=f"rows per transaction (1..{MAX_BATCH}, default 500)",
    )
    cleanup.add_argument(
        "--unsent-webhooks",
        action="store_true",
        help="the fleet has no ORCH_WEBHOOK_URL (any more): delete task-event webhooks never "
        "attempted and older than the retention, even where earlier ones were sent (without "
        "it they are kept wherever any webhook of the store was delivered, dead-lettered or "
        "tried)",
    )
    add_json_flag(cleanup)
    cleanup.set_defaults(handler=_cleanup)


def _cleanup(args: argparse.Namespace) -> int:
    from orchestrator.services.cleanup import run_cleanup
    from orchestrator.store.db import Database

    settings = load()
    if args.unsent_webhooks and settings.webhook_url:
        # Said before the store is opened: this process's own dispatcher would send them.
        raise CommandFailed(
            "--unsent-webhooks says the fleet has no webhook receiver, but ORCH_WEBHOOK_URL is "
            "set here",
            exit_code=2,
        )
    db = Database.from_url(settings.store_url)
    try:
        report = run_cleanup(
            db, settings, batch_size=args.batch_size, unsent_webhooks=args.unsent_webhooks
        )
    finally:
        db.dispose()
    if args.json:
        print_json(report.to_dict())
    else:
        print(describe(report))
    return 0


def describe(report: CleanupReport) -> str:
    """What a retention pass did, in one line (this command's, and the sweeper's hourly one)."""
    if not report.enabled:
        return f"cleanup disabled: {report.reason}; deleted nothing"
    return (
        f"deleted {report.receipts_deleted} invocation receipts older than "
        f"{report.retention_days} days (before {report.cutoff:%Y-%m-%d %H:%M:%S} UTC) "
        f"in {report.batches} batches, {report.transcript_entries_deleted} transcript "
        f"entries of finished tasks, and {report.webhooks_delivered_deleted} delivered or "
        "discarded "
        + (
            f"and {report.webhooks_never_sent_deleted} never sent (nothing sends them) "
            if report.never_sent_in_scope
            else ""
        )
        + "outbox webhooks; running and unknown receipts, dead-lettered and retrying "
        + "deliveries"
        + (
            ""
            if report.never_sent_in_scope
            else f", webhooks not sent yet ({report.never_sent_kept})"
        )
        + " and approved actions are kept"
    )
