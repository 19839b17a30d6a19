"""`orchestrator outbox list|show|retry|discard`: what an operator sees and does with the
deliveries to the business backend (`dispatch`, which sends them, lives in `outbox_dispatch`).

The CLI talks to the store directly (an operator on the machine), so `--by` names who
retries or discards a delivery (default: the user name), as `actions approve` and `tasks
requeue` do.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    bounded_int,
    checked_body,
    load,
    login_name,
    print_json,
    printable,
)
from orchestrator.cli.outbox_dispatch import register_dispatch
from orchestrator.cli.outbox_lines import list_line, show_lines
from orchestrator.domain.vocabulary import OUTBOX_KINDS, OUTBOX_STATUSES

if TYPE_CHECKING:
    from orchestrator.store.db import Database

__all__ = ["register"]


def register(commands: Any) -> None:
    group = commands.add_parser("outbox", help="approved actions and webhooks to the backend")
    outbox = group.add_subparsers(dest="outbox_command", metavar="ACTION", required=True)

    register_dispatch(outbox)

    listing = outbox.add_parser("list", help="deliveries, oldest first")
    listing.add_argument("--task", dest="task_id")
    listing.add_argument("--status", choices=OUTBOX_STATUSES)
    listing.add_argument("--kind", choices=OUTBOX_KINDS)
    listing.add_argument("--limit", type=bounded_int(1, 200), default=50)
    listing.add_argument(
        "--after",
        dest="after_id",
        type=bounded_int(0, 2**63 - 1),
        help="only deliveries after this outbox id (the next page: the line that ends a full "
        "page gives it)",
    )
    add_json_flag(listing)
    listing.set_defaults(handler=_list)

    show = outbox.add_parser("show", help="one delivery's whole state")
    show.add_argument("outbox_id", type=bounded_int(1, 2**63 - 1))
    add_json_flag(show)
    show.set_defaults(handler=_show)

    retry = outbox.add_parser(
        "retry",
        help="send a dead-lettered delivery (or every one) again, or a failing one now",
    )
    retry.add_argument("outbox_id", nargs="?", type=bounded_int(1, 2**63 - 1))
    retry.add_argument(
        "--all-dead",
        action="store_true",
        help="every dead-lettered delivery (with --kind, --task: of those only), once the "
        "backend or a secret is mended",
    )
    retry.add_argument(
        "--all-failing",
        action="store_true",
        help="every pending delivery that failed and waits out its backoff (with --kind, "
        "--task: of those only) due now, once the backend is mended after an outage",
    )
    retry.add_argument("--kind", choices=OUTBOX_KINDS, help="with --all-dead or --all-failing")
    retry.add_argument("--task", dest="task_id", help="with --all-dead or --all-failing")
    retry.add_argument("--by", default=None, help="who retries it (default: your user name)")
    retry.add_argument("--note", default=None, help="why, or what was mended (1..500 chars)")
    add_json_flag(retry)
    retry.set_defaults(handler=_retry)

    discard = outbox.add_parser(
        "discard",
        help="settle a delivery dealt with by hand, dead-lettered or failing (not while a "
        "dispatcher sends it): never sent again, and its task's later events go on",
    )
    discard.add_argument("outbox_id", type=bounded_int(1, 2**63 - 1))
    discard.add_argument("--reason", required=True, help="how it was dealt with (1..500 chars)")
    discard.add_argument("--by", default=None, help="who discards it (default: your user name)")
    add_json_flag(discard)
    discard.set_defaults(handler=_discard)


def _db() -> Database:
    from orchestrator.store.db import Database

    settings = load()
    return Database.from_url(settings.store_url, pool_size=1, max_overflow=1)


def _list(args: argparse.Namespace) -> int:
    from orchestrator.services.outbox_operations import OutboxService
    from orchestrator.store.types import utcnow

    db = _db()
    try:
        # One more than shown: a page cut short says so, and how to read on (300 dead letters
        # after a backend outage were silently the 50 oldest).
        service = OutboxService(db)
        rows = service.listed(
            task_id=args.task_id,
            status=args.status,
            kind=args.kind,
            after_id=args.after_id,
            limit=args.limit + 1,
        )
    finally:
        db.dispose()
    more, rows = len(rows) > args.limit, rows[: args.limit]
    follow = f"more follow: the same command with --after {rows[-1]['outbox_id']}" if more else ""
    if args.json:
        print_json(rows)
        if follow:  # stdout stays one JSON array (as `tasks list --json`); the way on beside it
            print(follow, file=sys.stderr)
        return 0
    now = utcnow()
    print("\n".join(list_line(row, now) for row in rows) or "no deliveries")
    if follow:
        print(follow)
    return 0


def _show(args: argparse.Namespace) -> int:
    from orchestrator.services.outbox_operations import OutboxService

    db = _db()
    try:
        row = OutboxService(db).shown(args.outbox_id)
    finally:
        db.dispose()
    if args.json:
        print_json(row)
        return 0
    print("\n".join(show_lines(row)))
    return 0


def _retry(args: argparse.Namespace) -> int:
    from orchestrator.services.outbox_operations import OutboxService

    if [args.outbox_id is not None, args.all_dead, args.all_failing].count(True) != 1:
        raise CommandFailed(
            "give one OUTBOX_ID, or --all-dead, or --all-failing (one of them)", exit_code=2
        )
    if args.outbox_id is not None and (args.kind or args.task_id):
        raise CommandFailed("--kind and --task go with --all-dead or --all-failing", exit_code=2)
    from orchestrator.services.operator_requests import RetryBody

    # Checked as the API checks them, before the store is opened (as `discard` does).
    by = login_name() if args.by is None else args.by
    body = checked_body(RetryBody, {"note": args.note, "by": by})
    who = {"by": str(body.by), "note": body.note}
    db = _db()
    try:
        if args.all_dead:
            count = OutboxService(db).retry_all(kind=args.kind, task_id=args.task_id, **who)
        elif args.all_failing:
            count, sending = OutboxService(db).retry_failing(
                kind=args.kind, task_id=args.task_id, **who
            )
        else:
            row = OutboxService(db).retry(args.outbox_id, **who)
    finally:
        db.dispose()
    if args.all_failing:
        if args.json:
            print_json({"retried": count, "being_sent": sending})
            return 0
        left = (
            f"; {sending} being sent {'was' if sending == 1 else 'were'} left to "
            "the dispatcher (retry once the answer is recorded, if it failed again)"
            if sending
            else ""
        )
        print(f"{count} failing deliver{'y is' if count == 1 else 'ies are'} due now{left}")
        return 0
    if args.all_dead:
        if args.json:
            print_json({"retried": count})
        else:
            print(f"{count} dead-lettered deliver{'y is' if count == 1 else 'ies are'} due again")
        return 0
    if args.json:
        print_json(row.public())
    else:
        print(f"outbox {row.outbox_id} is due again (task {row.task_id})")
    return 0


def _discard(args: argparse.Namespace) -> int:
    from orchestrator.services.operator_requests import DiscardBody
    from orchestrator.services.outbox_operations import OutboxService

    # Checked as the API checks them, before the store is opened: only an absent --by means
    # the user; an empty one (an unset $NAME) is refused, not recorded as the OS user's.
    by = login_name() if args.by is None else args.by
    body = checked_body(DiscardBody, {"reason": args.reason, "by": by})
    db = _db()
    try:
        row = OutboxService(db).discard(args.outbox_id, reason=body.reason, by=str(body.by))
    finally:
        db.dispose()
    if args.json:
        print_json(row.public())
    else:
        what = (
            "its task's later events go on"
            if row.kind == "webhook"
            else f"approved action {row.action_id} is not sent"
        )
        print(f"outbox {row.outbox_id} discarded by {printable(row.discarded_by)}: {what}")
    return 0
