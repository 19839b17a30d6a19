"""`orchestrator actions list|show|approve|reject`: only a human carries an action forward.

The CLI talks to the store directly (an operator on the machine), so `--by` names who decides.
An approval names the digest `actions show` printed; a decision wakes the next generation.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import (
    add_json_flag,
    bounded_int,
    checked_body,
    command_runtime,
    cursor_arg,
    login_name,
    print_json,
    printable,
    time_text,
)
from orchestrator.cli.delivery_states import (
    being_sent,
    delivered_after_discard,
    error_label,
    holding,
    hurriable,
    ways_out,
)
from orchestrator.cli.wake_ups import held_notices, quiet_dispatch_log, say_unsent
from orchestrator.domain.vocabulary import ACTION_STATUSES

if TYPE_CHECKING:
    from orchestrator.store.actions import ActionRecord

__all__ = ["register"]

MAX_LIMIT = 200  # the API's bound on `GET /api/v1/actions?limit=`


def register(commands: Any) -> None:
    group = commands.add_parser("actions", help="proposed work orders and commands")
    actions = group.add_subparsers(dest="actions_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="actions (default: those awaiting approval)")
    # One or the other, as the usage line says: `--all` would silently win over a status.
    statuses = listing.add_mutually_exclusive_group()
    statuses.add_argument("--status", choices=ACTION_STATUSES, default="pending_approval")
    statuses.add_argument("--all", action="store_true", help="every status")
    statuses.add_argument(
        "--decided",
        action="store_true",
        help="every status but pending_approval: who approved or rejected what",
    )
    listing.add_argument("--task", dest="task_id")
    listing.add_argument(
        "--oldest",
        action="store_true",
        help="oldest first: the longest waiting, what an approver decides first",
    )
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=100,
        help=f"at most this many (1..{MAX_LIMIT}, default 100)",
    )
    listing.add_argument(
        "--cursor", type=cursor_arg, help="the next page, as printed after the previous one"
    )
    add_json_flag(listing)
    listing.set_defaults(handler=_list)

    show = actions.add_parser("show", help="what an action would do, and its digest")
    show.add_argument("action_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)

    for verb in ("approve", "reject"):
        decide = actions.add_parser(verb, help=f"{verb} a pending action")
        decide.add_argument("action_id")
        decide.add_argument(
            "--digest",
            required=verb == "approve",
            type=_digest,
            help="the digest `actions show` printed (required to approve)",
        )
        decide.add_argument("--by", default=None, help="who decides (default: your user name)")
        decide.add_argument("--note")
        add_json_flag(decide)
        decide.set_defaults(handler=_decide, approve=verb == "approve")


def _list(args: argparse.Namespace) -> int:
    from orchestrator.domain.cursors import encode_cursor

    status = None if args.all or args.decided else args.status
    rt = command_runtime()
    try:
        rows = rt.actions.listed(
            status=status,
            task_id=args.task_id,
            limit=args.limit + 1,  # one more says whether a next page exists
            cursor=args.cursor,
            oldest_first=args.oldest,
            decided=args.decided,
        )
        pending = rt.actions.count_pending(args.task_id) if status == "pending_approval" else None
    finally:
        rt.close()
    found = rows[: args.limit]
    last = found[-1][0] if len(rows) > args.limit else None
    cursor = (
        encode_cursor(last.created_at, last.action_id, oldest_first=args.oldest) if last else None
    )
    more = f"next page: {_next_page(args, cursor)}" if cursor else ""
    if args.json:
        print_json([{**_as_sent(action), "delivery": delivery} for action, delivery in found])
        if more:  # stdout stays one JSON array; the way on goes beside it
            print(more, file=sys.stderr)
        return 0
    if pending is not None and (args.cursor or cursor):
        # Only some of them are shown: say how many wait in all.
        print(f"{pending} pending; {len(found)} on this page")
    if not found:
        print("no actions")
    for action, delivery in found:
        print(
            f"{action.action_id}  {action.status:16}  {action.kind:10}  task {action.task_id}"
            f"  node {action.node_id}" + (f"  {_delivery_brief(delivery)}" if delivery else "")
        )
    if more:
        print(more)
    return 0


def _next_page(args: argparse.Namespace, cursor: str) -> str:
    """The command that lists the page after this one, with the same filters and order."""
    words = ["orchestrator", "actions", "list"]
    if args.all or args.decided:
        words.append("--all" if args.all else "--decided")
    else:
        words += ["--status", args.status]
    if args.task_id:
        words += ["--task", args.task_id]
    if args.oldest:
        words.append("--oldest")
    if args.limit != 100:
        words += ["--limit", str(args.limit)]
    if args.json:
        words.append("--json")
    return shlex.join([*words, "--cursor", cursor])


def _digest(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise argparse.ArgumentTypeError("a digest is 64 lowercase hex digits")
    return text


def _show(args: argparse.Namespace) -> int:
    rt = command_runtime()
    try:
        action, delivery = rt.actions.shown(args.action_id)
    finally:
        rt.close()
    view = {**_as_sent(action), "delivery": delivery}
    if args.json:
        print_json(view)
        return 0
    print(f"action {action.action_id}  {action.status}")
    print(f"  {action.kind} for node {action.node_id} of task {action.task_id}")
    print(
        f"  proposed by generation {action.generation} under plan revision {action.plan_revision}"
    )
    print(f"  digest {action.digest}")
    payload = view["payload"]
    if isinstance(payload, str):  # stored by an older version in another shape than an object
        print("  payload (not an object):")
        print(f"    {printable(payload)}")
    else:
        print("  payload:")
        for line in json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False).split("\n"):
            print(f"    {line}")
    if action.decided_by:
        # Escaped: a note (or a name) stored with terminal escapes must not drive the terminal.
        print(
            f"  decided by {printable(action.decided_by)} at {time_text(action.decided_at)}: "
            f"{printable(action.note or '')}"
        )
    if delivery is not None:
        print(f"  delivery: {_delivery_line(delivery)}")
    return 0


def _delivery_brief(row: dict[str, Any]) -> str:
    """An approved action's delivery in a list line: where it stands, and the outbox id to act
    on (`actions show` says the rest)."""
    status, number = row["status"], row["outbox_id"]
    if hurriable(row):
        status += f" after {row['attempts']} attempt(s): outbox retry {number} or discard it"
    elif status == "pending" and row["attempts"]:
        status += f" after {row['attempts']} attempt(s)"
    elif status == "pending":
        status += ", not sent yet"
    elif status == "dead":
        status += f": outbox retry {number} or discard it"
    elif status == "discarded":
        status += ", never delivered"
    elif delivered_after_discard(row):
        status += " after its discard"
    return f"delivery {status} (outbox {number})"


def _delivery_line(row: dict[str, Any]) -> str:
    """Where an approved action's delivery to the business backend stands, in one line: only
    `delivered` says the backend has it."""
    from orchestrator.store.types import utcnow

    number, status = row["outbox_id"], row["status"]
    if status == "delivered":
        line = f"delivered at {time_text(row['delivered_at'])} (outbox {number})"
        if delivered_after_discard(row):  # the backend acted on it all the same: say both
            line += (
                f", after its discard by {printable(row['discarded_by'] or '')} at "
                f"{time_text(row['discarded_at'])}: {printable(row['discard_reason'] or '')}"
            )
        return line
    if status == "discarded":
        return (
            f"discarded by {printable(row['discarded_by'] or '')} at "
            f"{time_text(row['discarded_at'])}: {printable(row['discard_reason'] or '')} "
            f"(outbox {number}; never delivered)"
        )
    tried = f"{row['attempts']} attempt(s)" + (
        f", {error_label(row)}: {printable(row['last_error'])}" if row["last_error"] else ""
    )
    if status == "dead":
        return (
            f"dead after {tried} (outbox {number}): `orchestrator outbox retry {number}` "
            f"once the backend is mended, or `outbox discard {number} --reason R`"
        )
    if being_sent(row, utcnow()):  # posted, or waiting its turn in the dispatcher's batch
        return f"{status}, {tried}, {holding(row)} (outbox {number})"
    at = time_text(row["next_attempt_at"])
    line = f"{status}, {tried}, next attempt at {at} (outbox {number})"
    if hurriable(row):
        # Failing and backing off: an action is retried until a 2xx, so the operator's ways
        # out are to hurry it once the backend is mended, or settle it by hand.
        line += f": {ways_out(number)}"
    return line


def _as_sent(action: ActionRecord) -> dict[str, Any]:
    """The action as the API sends its payload: one an older version stored in another shape
    than an object is its JSON text."""
    from orchestrator.api.older_shapes import payload_as_sent

    return {**action.to_dict(), "payload": payload_as_sent(action.payload)}


def _decide(args: argparse.Namespace) -> int:
    from orchestrator.services.operator_requests import Decision

    # Who decides and the note, checked as the API checks them (before the store is opened):
    # only an absent --by means the user; an empty one (an unset $APPROVER) is refused, not
    # recorded as the OS user's approval.
    by = login_name() if args.by is None else args.by
    body = checked_body(Decision, {"by": by, "note": args.note})
    rt = command_runtime()  # a decision may queue a generation
    quiet_dispatch_log()
    try:
        with held_notices() as notices:
            decided = rt.actions.decide_and_wake(
                args.action_id,
                approve=args.approve,
                by=body.by,
                note=body.note,
                digest=args.digest,
            )
    finally:
        rt.close()
    action, wake_up = decided.action, decided.wake_up
    if args.json:
        print_json(
            _as_sent(action)
            | {
                "queued_generation": None if wake_up is None else wake_up.generation,
                "dispatched": None if wake_up is None else wake_up.sent,
            }
        )
    else:
        print(f"action {action.action_id} {action.status} by {action.decided_by}")
    change = "approval" if args.approve else "rejection"
    say_unsent(wake_up, action.task_id, change, rt.settings, notices)
    return 0
