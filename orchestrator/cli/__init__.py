"""The operator CLI `orchestrator`. Each command group lives in its own module with `register()`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sqlalchemy.exc import DataError, OperationalError, ProgrammingError, SQLAlchemyError

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
from orchestrator.cli.common import CommandFailed, Handler, OneLineParser, one_line, safe_store_url
from orchestrator.cli.store_errors import describe_store_error
from orchestrator.errors import OrchestratorError
from orchestrator.settings import SettingsError

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
    try:
        code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at exit
        return code
    except SettingsError as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        return exc.exit_code
    except OrchestratorError as exc:
        print(f"orchestrator: {exc.code}: {exc.message}", file=sys.stderr)
        for detail in exc.details:
            print(f"  - {detail.get('code', '')}: {detail.get('message', '')}", file=sys.stderr)
        return 1
    except DataError as exc:
        # A value the store cannot hold (a negative LIMIT, a JSON text Postgres refuses):
        # bad input, and the transaction that carried it wrote nothing.
        print(f"orchestrator: the store refused a value: {one_line(exc)}", file=sys.stderr)
        return 2
    except (OperationalError, ProgrammingError) as exc:
        print(f"orchestrator: {describe_store_error(exc)}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:
        store = safe_store_url() or "the configured URL"
        print(f"orchestrator: the store at {store} failed: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `orchestrator tasks list --json | head`: the reader left; end quietly, and keep the
        # interpreter's final flush from reporting the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
