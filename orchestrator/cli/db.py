"""`orchestrator db upgrade|downgrade|current`: the schema, through Alembic.

Alembic is imported by the functions that migrate or read a revision, not with the parser
that every command builds.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import CommandFailed, add_json_flag, load, mask_url, print_json

if TYPE_CHECKING:
    from alembic.util.exc import CommandError

__all__ = ["check_store_ready", "refuse_newer_store", "register"]


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


def check_store_ready(url: str) -> None:
    """Refuse, in one line, a store that is not at this code's head revision.

    An unreachable store raises the driver's error, which `main` turns into one line too.
    """
    from orchestrator.store import migrations

    current = migrations.current_revision(url)
    head = migrations.head_revision()
    _refuse_newer(url, current, head)
    if current != head:
        at = f"at revision {current}" if current else "empty"
        raise CommandFailed(
            f"the store at {mask_url(url)} is not migrated ({at}, this code needs {head}): "
            "run `orchestrator db upgrade`"
        )


def refuse_newer_store(url: str) -> None:
    """Refuse, in one line, a store migrated by a newer version than this code."""
    from orchestrator.store import migrations

    _refuse_newer(url, migrations.current_revision(url), migrations.head_revision())


def _refuse_newer(url: str, current: str | None, head: str | None) -> None:
    """A store at a revision this code does not know was migrated by a newer version (a rolling
    upgrade under way, or a rollback of the code alone): `db upgrade` cannot help."""
    from orchestrator.store import migrations

    if current is not None and not migrations.is_known(current):
        raise CommandFailed(
            f"the store at {mask_url(url)} is at revision {current}, newer than this code's "
            f"newest ({head}): a newer orchestrator migrated it; run that version (or "
            f"downgrade the store to {head} with it)"
        )


def _revision_error(exc: CommandError) -> CommandFailed:
    from orchestrator.store import migrations

    line = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown revision"
    head = migrations.head_revision()
    return CommandFailed(f"{line} (the newest is {head}; or use head, base)", exit_code=2)


def _upgrade(args: argparse.Namespace) -> int:
    from alembic.util.exc import CommandError

    from orchestrator.store import migrations

    settings = load()
    refuse_newer_store(settings.store_url)
    try:
        migrations.upgrade(settings.store_url, args.revision)
    except CommandError as exc:
        raise _revision_error(exc) from None
    print(f"store at revision {migrations.current_revision(settings.store_url)}")
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    from alembic.util.exc import CommandError

    from orchestrator.store import migrations

    settings = load()
    try:
        migrations.downgrade(settings.store_url, args.revision)
    except CommandError as exc:
        raise _revision_error(exc) from None
    print(f"store at revision {migrations.current_revision(settings.store_url) or 'base'}")
    return 0


def _current(args: argparse.Namespace) -> int:
    from orchestrator.store import migrations

    settings = load()
    current = migrations.current_revision(settings.store_url)
    head = migrations.head_revision()
    if args.json:
        print_json({"current": current, "head": head})
    else:
        newer = current is not None and not migrations.is_known(current)
        said = ": newer than this code" if newer else ""
        print(f"current {current or 'base'} (head {head}){said}")
    return 0
