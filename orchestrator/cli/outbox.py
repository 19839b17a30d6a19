"""`orchestrator outbox dispatch|list|show|retry|discard`: deliveries to the business backend.

The CLI talks to the store directly (an operator on the machine), so `--by` names who
retries or discards a delivery (default: the user name), as `actions approve` and `tasks
requeue` do.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from datetime import datetime
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
from orchestrator.cli.stopping import StopSignals
from orchestrator.domain.vocabulary import OUTBOX_KINDS, OUTBOX_STATUSES

if TYPE_CHECKING:
    from orchestrator.store.db import Database

__all__ = [
    "being_sent",
    "dead_label",
    "delivered_after_discard",
    "error_label",
    "holding",
    "hurriable",
    "posting",
    "register",
    "ways_out",
]

log = logging.getLogger("orchestrator.outbox")


def register(commands: Any) -> None:
    group = commands.add_parser("outbox", help="approved actions and webhooks to the backend")
    outbox = group.add_subparsers(dest="outbox_command", metavar="ACTION", required=True)

    dispatch = outbox.add_parser("dispatch", help="send due deliveries, in a loop")
    dispatch.add_argument("--once", action="store_true", help="one round, then exit")
    dispatch.set_defaults(handler=_dispatch)

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


#: What each kind is, and the setting without which this process does not send it.
_UNSENT = {
    "action": "approved actions (ORCH_ACTIONS_URL is unset here)",
    "webhook": "task events (ORCH_WEBHOOK_URL is unset here)",
}


def _dispatch(args: argparse.Namespace) -> int:
    from orchestrator.logs import configure_logging
    from orchestrator.services.outbox import OutboxDispatcher
    from orchestrator.store.db import Database

    settings = load()
    if args.once and not settings.outbox_kinds:
        # "delivered 0" read as nothing being due, from a laptop without the fleet's URLs.
        raise CommandFailed(
            "nothing to dispatch: neither ORCH_ACTIONS_URL nor ORCH_WEBHOOK_URL is set here "
            "(deliveries wait in the outbox for a dispatcher that has them)",
            exit_code=2,
        )
    # Said with every report: rows of a kind whose URL is unset here wait, they are not done.
    unsent = [text for kind, text in _UNSENT.items() if kind not in settings.outbox_kinds]
    left = f"; not sent here: {', '.join(unsent)}" if settings.outbox_kinds and unsent else ""
    # As the sweeper's: ORCH_LOG_FORMAT, and masked (httpx logs each request's URL at INFO).
    configure_logging(settings)
    db = Database.from_url(settings.store_url, pool_size=2, max_overflow=1)
    dispatcher = OutboxDispatcher(settings, db)
    try:
        if args.once:
            report = dispatcher.run_once()
            print(
                f"delivered {len(report.delivered)}, failed {len(report.failed)}, "
                f"dead-lettered {len(report.dead)}, throttled {len(report.throttled)}{left}"
            )
            return 0
        signals = StopSignals()
        started = f"dispatching {', '.join(dispatcher.kinds) or 'nothing (no URL set)'}{left}"
        if settings.log_format == "json":
            log.info("%s", started)  # every line a JSON object, as the sweeper's
        else:
            print(started, flush=True)
        # The rounds run in a thread: the main thread only waits for the signal, so no handler
        # ever meets a lock the main thread holds (see orchestrator.cli.stopping).
        failed: list[BaseException] = []

        def _send() -> None:
            try:
                dispatcher.run(signals.event)
            except BaseException as exc:  # raised again below, in the main thread
                failed.append(exc)

        sender = threading.Thread(target=_send, name="outbox", daemon=True)
        sender.start()
        try:
            while sender.is_alive() and not signals.wait(1.0):
                pass
        finally:
            signals.event.set()
            sender.join(timeout=settings.outbox_timeout_seconds + 1)
            signals.close()
        if failed:
            raise failed[0]
        return 0
    finally:
        dispatcher.close()
        db.dispose()


def _line(row: dict[str, Any], now: datetime) -> str:
    what = row["action_id"] if row["kind"] == "action" else f"event {row['event_id']}"
    what += _next_attempt(row, now)
    error = f"  {error_label(row)}: {row['last_error']}" if row["last_error"] else ""
    if dead_label(row):
        error += f"  {dead_label(row)}"
    if row["status"] == "discarded":
        # Typed by a person: a newline or a bidi control must not forge or reorder a line.
        error += (
            f"  discarded by {printable(row['discarded_by'])}: {printable(row['discard_reason'])}"
        )
    elif delivered_after_discard(row):
        error += (
            f"  delivered after its discard by {printable(row['discarded_by'])}: "
            f"{printable(row['discard_reason'])}"
        )
    if row["waits_behind"]:
        # Due and never attempted, it read as a stuck dispatcher: it is held back in order.
        error += (
            f"  waits behind dead letter outbox {row['waits_behind']} (outbox retry or discard it)"
        )
    elif row.get("waits_behind_retried"):
        # Behind an earlier event failing, not dead yet: the one to look at is that one.
        error += f"  waits behind outbox {row['waits_behind_retried']}, being retried"
    return (
        f"{row['outbox_id']:>6}  {row['kind']:7}  {row['status']:9}  "
        f"attempts {row['attempts']:<3}  throttled {row['throttled']:<3}  "
        f"task {row['task_id']}  {what}{error}"
    )


def _next_attempt(row: dict[str, Any], now: datetime) -> str:
    """When a pending row is tried next, from now (`  next attempt in 4m10s`): an operator
    watching a failing receiver sees when it is tried again, and one due long ago (`due 12m
    ago`) is no dispatcher sending. One a dispatcher is sending says so (its time is the
    claim's hold, not a next attempt). Nothing for a row held behind another (its own time
    means nothing until that one goes) nor for a row that is not pending."""
    at = row.get("next_attempt_at")
    if row["status"] != "pending" or not isinstance(at, datetime):
        return ""
    if row.get("waits_behind") or row.get("waits_behind_retried"):
        return ""
    if posting(row, now):
        return "  being sent now"
    if being_sent(row, now):  # claimed with the rows before it in the batch, not posted yet
        return "  claimed by a dispatcher: waits its turn in its batch"
    seconds = (at - now).total_seconds()
    if seconds >= 1:
        return f"  next attempt in {_span(seconds)}"
    return f"  next attempt due {_span(-seconds)} ago" if seconds <= -1 else "  next attempt due"


def being_sent(row: dict[str, Any], now: datetime) -> bool:
    """A dispatcher holds the pending row to send it (its claim's hold not run out): posted
    (`posting`), or waiting its turn in the dispatcher's batch."""
    until = row.get("claimed_until")
    return row["status"] == "pending" and isinstance(until, datetime) and until > now


def posting(row: dict[str, Any], now: datetime) -> bool:
    """`being_sent`, and posted: its dispatcher waits for the backend's answer to it. A
    batch's rows are claimed together and posted one after another (`sending_since`)."""
    return being_sent(row, now) and row.get("sending_since") is not None


def holding(row: dict[str, Any]) -> str:
    """What a dispatcher's claim of the row is doing, for a line: `being sent now (attempt N,
    held until T, posted at S)` or that it waits its turn in the batch (attempt, hold)."""
    from orchestrator.store.types import utcnow

    claim = f"attempt {row['attempts']}, held until {_time(row['claimed_until'])}"
    if posting(row, utcnow()):
        return f"being sent now ({claim}, posted at {_time(row['sending_since'])})"
    return f"claimed by a dispatcher, waiting its turn in its batch ({claim})"


def delivered_after_discard(row: dict[str, Any]) -> bool:
    """Delivered, though an operator discarded it before: the send under way at the discard
    (its hold had run out) was answered 2xx, so the backend did act on it."""
    return row["status"] == "delivered" and row.get("discarded_at") is not None


def hurriable(row: dict[str, Any]) -> bool:
    """A pending delivery that failed and waits out its backoff (not being sent): `outbox
    retry N` makes it due now, `outbox discard N` settles it."""
    from orchestrator.store.types import utcnow

    at = row.get("next_attempt_at")
    now = utcnow()
    return (
        row["status"] == "pending"
        and bool(row["attempts"] or row["last_error"])
        and isinstance(at, datetime)
        and at > now
        and not being_sent(row, now)
    )


def ways_out(number: int) -> str:
    """The operator's ways out of a failing delivery, as `actions show` and `tasks show` say
    them: an action is retried until a 2xx, so waiting alone may never end."""
    return (
        f"`orchestrator outbox retry {number}` sends it now once the backend is mended, "
        f"or `outbox discard {number} --reason R` once dealt with by hand"
    )


def _span(seconds: float) -> str:
    """A duration in its two largest units: 45s, 4m10s, 2h05m, 3d04h."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def dead_label(row: dict[str, Any]) -> str:
    """Why the row was dead-lettered, when its error does not say it: a refusal's error does
    (`a permanent refusal, not retried`), the last of a webhook's attempts' did not (`HTTP 503`
    read as one more failure that the dispatcher would retry)."""
    if row.get("dead_reason") != "max_attempts":
        return ""
    counted = row["attempts"] - row["throttled"]
    return f"dead-lettered: out of attempts ({counted} failed, ORCH_WEBHOOK_MAX_ATTEMPTS)"


def error_label(row: dict[str, Any]) -> str:
    """A pending row with an error and no attempt was retried by an operator since: its error
    is from before (it read as the retry having failed, a 401's "then retry" most of all)."""
    if row["status"] == "pending" and not row["attempts"]:
        return "last error, before the retry"
    return "last error"


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
    print("\n".join(_line(row, now) for row in rows) or "no deliveries")
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
    print("\n".join(_shown(row)))
    return 0


def _shown(row: dict[str, Any]) -> list[str]:
    """The row's whole state, a fact a line, and what an operator can do about it."""
    from orchestrator.store.types import utcnow

    number, status = row["outbox_id"], row["status"]
    what = (
        f"approved action {row['action_id']}"
        if row["kind"] == "action"
        else (f"task event {row['event_id']}")
    )
    lines = [f"outbox {number}  {status}  {what}  task {row['task_id']}"]
    lines.append(f"  written {_time(row['created_at'])}")
    lines.append(f"  attempts {row['attempts']} (throttled {row['throttled']})")
    if row["last_error"]:
        lines.append(f"  {error_label(row)}: {printable(row['last_error'])}")
    if dead_label(row):
        lines.append(f"  {dead_label(row)}")
    if row.get("retried_at") is not None:
        # Who made it due again (or hurried it), as a discard says who settled it.
        note = f": {printable(row['retry_note'])}" if row.get("retry_note") else ""
        lines.append(f"  retried by {_retrier(row)} at {_time(row['retried_at'])}{note}")
    released = row.get("released_at")
    if isinstance(released, datetime) and released > row["created_at"]:
        # The gauge times its wait from then: written three days ago and retried a minute ago,
        # it has not waited three days for a dispatcher.
        lines.append(
            f"  due again from {_time(released)}, {_released_by(row)}: "
            "orchestrator_outbox_oldest_pending_seconds times its wait from then, not from "
            "when it was written"
        )
    if posting(row, utcnow()):
        lines.append(
            f"  being sent now (attempt {row['attempts']}, held until "
            f"{_time(row['claimed_until'])}, posted at {_time(row['sending_since'])}): a retry "
            "or discard waits until its answer is recorded"
        )
    elif being_sent(row, utcnow()):
        lines.append(
            "  claimed by a dispatcher, not sent yet: it waits its turn in the batch the "
            f"dispatcher sends (attempt {row['attempts']}, held until "
            f"{_time(row['claimed_until'])}); a retry waits until its answer is recorded, a "
            "discard settles it now (the dispatcher then skips it)"
        )
    elif status == "pending" and not (row["waits_behind"] or row["waits_behind_retried"]):
        lines.append(f"  next attempt {_time(row['next_attempt_at'])}")
    if row["waits_behind"]:  # its own next attempt is past, and means nothing until then
        lines.append(
            f"  waits behind dead letter outbox {row['waits_behind']} (outbox retry or discard it)"
        )
    elif row["waits_behind_retried"]:
        lines.append(f"  waits behind outbox {row['waits_behind_retried']}, being retried")
    if status == "delivered":
        after = (
            ", after its discard: the send under way then was answered 2xx (the backend did act "
            "on it)"
            if delivered_after_discard(row)
            else ""
        )
        lines.append(f"  delivered {_time(row['delivered_at'])}{after}")
    if status == "discarded" or delivered_after_discard(row):
        # One discarded while pending was never dead-lettered: it failed, and a person settled it.
        was = (
            " (it was pending, not dead-lettered)" if row.get("discarded_from") == "pending" else ""
        )
        lines.append(
            f"  discarded by {printable(row['discarded_by'])} at {_time(row['discarded_at'])}"
            f"{was}: {printable(row['discard_reason'])}"
        )
    held = row["waits_behind"] or row["waits_behind_retried"]
    if status == "pending" and row["last_error"] and not (held or being_sent(row, utcnow())):
        # Failing, not dead: an action is retried until a 2xx, so one the backend always
        # refuses with a 500 is settled by a person or sent for ever. A retry hurries only one
        # that backs off (one due now is due already).
        at = row["next_attempt_at"]
        hurry = (
            f"`orchestrator outbox retry {number}` sends it now once the backend is mended, or "
            if isinstance(at, datetime) and at > utcnow()
            else ""
        )
        lines.append(
            f"  {hurry}`orchestrator outbox discard {number} --reason R` once dealt with by hand"
        )
    if status == "dead":
        lines.append(
            f"  `orchestrator outbox retry {number}` once the backend is mended, or "
            f"`orchestrator outbox discard {number} --reason R` once dealt with by hand"
        )
    return lines


def _released_by(row: dict[str, Any]) -> str:
    """What made the row deliverable again at its `released_at`, as far as the row tells: its
    own retry out of the dead letters (the retry's time is the release's), or, for a task
    event, a retry or discard of an earlier event of its task that held it back."""
    own = row.get("retried_at") == row["released_at"] or row["kind"] == "action"
    if own:
        return "when an operator's retry took it out of the dead letters (fresh counts)"
    earlier = (
        "when an operator retried or discarded an earlier event of its task that held it back "
        "(a task's events go in order)"
    )
    if row.get("retried_at") is None:
        return earlier
    # Retried since (hurried while pending): its own retry out of the dead letters before that,
    # or an earlier event's; the row does not keep which.
    return f"{earlier}, or retried it out of the dead letters"


def _time(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)


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


def _retrier(row: dict[str, Any]) -> str:
    """Who retried the row; a retry stored without a name read `retried by  at T`."""
    return printable(row["retried_by"]) if row.get("retried_by") else "an unrecorded name"
