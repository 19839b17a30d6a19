"""Runs a command's handler and turns what it raises into one line on stderr and an exit code:
a bad setting or argument 2, a store or a lookup that fails 1, a closed pipe 141."""

from __future__ import annotations

import argparse
import os
import sys

from sqlalchemy.exc import DataError, OperationalError, ProgrammingError, SQLAlchemyError

from orchestrator.cli.common import CommandFailed, Handler, one_line, safe_store_url
from orchestrator.cli.store_errors import describe_store_error
from orchestrator.errors import OrchestratorError
from orchestrator.settings import SettingsError

__all__ = ["run"]


def run(handler: Handler, args: argparse.Namespace) -> int:
    """`handler(args)`'s exit code, or the code of what it raised, said in one line."""
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
