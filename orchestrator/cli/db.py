"""`orchestrator db upgrade|downgrade|current`: the schema, through Alembic."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import add_json_flag, load, print_json
from orchestrator.store import migrations

__all__ = ["register"]


def register(commands: Any) -> None:
    db = commands.add_parser("db", help="database schema (Alembic migrations)")
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)

    up = actions.add_parser("upgrade", help="migrate the configured store up (default: head)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(handler=_upgrade)

    down = actions.add_parser("downgrade", help="migrate the configured store down to REVISION")
    down.add_argument("revision", help="target revision, or 'base' to remove everything")
    down.set_defaults(handler=_downgrade)

    current = actions.add_parser("current", help="print the store's schema revision")
    add_json_flag(current)
    current.set_defaults(handler=_current)


def _upgrade(args: argparse.Namespace) -> int:
    settings = load()
    migrations.upgrade(settings.store_url, args.revision)
    print(f"store at revision {migrations.current_revision(settings.store_url)}")
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    settings = load()
    migrations.downgrade(settings.store_url, args.revision)
    print(f"store at revision {migrations.current_revision(settings.store_url) or 'base'}")
    return 0


def _current(args: argparse.Namespace) -> int:
    settings = load()
    current = migrations.current_revision(settings.store_url)
    head = migrations.head_revision()
    if args.json:
        print_json({"current": current, "head": head})
    else:
        print(f"current {current or 'base'} (head {head})")
    return 0
