"""`orchestrator invocations show ID`: one write receipt, as operators may see it; and
`orchestrator invocations resolve ID --as succeeded|failed --reason TEXT`: an operator settles
an `unknown` or `pending` task write (see `services.invocations`).

The CLI talks to the store directly (an operator on the machine), so `--by` names who acts.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    checked_body,
    command_runtime,
    load,
    login_name,
    print_json,
)
from orchestrator.cli.wake_ups import held_notices, quiet_dispatch_log, say_unsent

__all__ = ["register"]


def register(commands: Any) -> None:
    group = commands.add_parser("invocations", help="write receipts (invocation records)")
    actions = group.add_subparsers(dest="invocations_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the latest observed status of one invocation")
    show.add_argument("invocation_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)
    resolve = actions.add_parser(
        "resolve", help="settle an unknown or pending task write as succeeded or failed"
    )
    resolve.add_argument("invocation_id")
    resolve.add_argument(
        "--as", dest="status", required=True, choices=("succeeded", "failed"), help="what happened"
    )
    resolve.add_argument("--reason", required=True, help="how you know (recorded with your name)")
    resolve.add_argument("--by", help="who resolves it (default: your user name)")
    add_json_flag(resolve)
    resolve.set_defaults(handler=_resolve)


def _show(args: argparse.Namespace) -> int:
    from orchestrator.store.db import Database
    from orchestrator.store.receipts import ReceiptLedger

    settings = load()
    db = Database.from_url(settings.store_url)
    try:
        receipt = ReceiptLedger(db).get(args.invocation_id)
    finally:
        db.dispose()
    if receipt is None:
        raise CommandFailed(f"no invocation {args.invocation_id}", exit_code=1)
    view = receipt.public()
    if args.json:
        print_json(view)
        return 0
    width = max(len(key) for key in view)
    for key, value in view.items():
        print(f"{key.ljust(width)}  {'-' if value is None else value}")
    return 0


def _resolve(args: argparse.Namespace) -> int:
    from orchestrator.api.change_views import ResolvedView
    from orchestrator.services.invocations import InvocationService
    from orchestrator.services.operator_requests import ResolveBody

    # Only an absent --by means the user: an empty one (an unset $NAME) is refused below.
    by = login_name() if args.by is None else args.by
    # The API's own body model checks the texts: the same limits on both paths.
    body = checked_body(ResolveBody, {"status": args.status, "reason": args.reason, "by": by})
    rt = command_runtime()  # the resolution may queue a generation
    quiet_dispatch_log()
    try:
        with held_notices() as notices:
            resolution = InvocationService(rt.db, rt.dispatcher).resolve(
                args.invocation_id, body.status, by=body.by or by, reason=body.reason
            )
    finally:
        rt.close()
    if args.json:
        print_json(ResolvedView.of(resolution).model_dump(mode="json"))
        say_unsent(resolution.wake_up, resolution.task_id, "resolution", rt.settings, notices)
        return 0
    receipt = resolution.receipt
    queued = (
        f", generation {resolution.queued_generation} queued"
        if resolution.queued_generation is not None
        else f", generation {resolution.generation}"
    )
    print(
        f"invocation {receipt.invocation_id} ({receipt.tool_name}) {resolution.previous_status} "
        f"-> {receipt.status} by {resolution.by}; task {resolution.task_id} is "
        f"{resolution.task_status}{queued}"
    )
    say_unsent(resolution.wake_up, resolution.task_id, "resolution", rt.settings, notices)
    return 0
