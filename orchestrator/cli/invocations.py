"""`orchestrator invocations show ID`: one write receipt, as operators may see it."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import CommandFailed, add_json_flag, load, print_json
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger

__all__ = ["register"]


def register(commands: Any) -> None:
    group = commands.add_parser("invocations", help="write receipts (invocation records)")
    actions = group.add_subparsers(dest="invocations_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the latest observed status of one invocation")
    show.add_argument("invocation_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
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
