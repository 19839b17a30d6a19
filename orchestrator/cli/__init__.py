"""The operator CLI `orchestrator`. Each command group lives in its own module with `register()`.

Building the parser imports the group modules and no more: `orchestrator --help` and a usage
error are answered without the store, the settings or the HTTP client, which a command's
handler imports when it runs (tests/unit/test_cli_imports.py holds them to it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from orchestrator import __version__
from orchestrator.cli import (
    actions,
    api,
    cleanup,
    db,
    demo,
    fleet,
    invocations,
    outbox,
    plans,
    tasks,
)
from orchestrator.cli.common import Handler, OneLineParser

__all__ = ["build_parser", "main"]

GROUPS = (demo, db, tasks, actions, outbox, fleet, api, plans, invocations, cleanup)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="orchestrator",
        description="Run and operate agent-driven condition tasks.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            # Undecodable bytes on the command line; no store would take them either.
            shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")[:80]
            print(f'orchestrator: argument "{shown}" is not valid UTF-8 text', file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    from orchestrator.cli.running import run

    return run(handler, args)
