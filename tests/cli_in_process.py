"""The `orchestrator` CLI run in this process through `main()`, answered as a finished process.

For cases that differ only in their arguments: a real process spends about a second of CPU
importing before it does anything, and what such a case checks (the exit code, the lines on
stdout and stderr) is what `main()` returns and prints. As in a process of its own, the command
sees no ORCH_ variable but those given, runs in `cwd`, and starts with no settings loaded.
What only a real process shows stays with real processes: the interpreter's own exit, argv
decoding, logging's last resort (pytest holds the root logger here), signals.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

from orchestrator.cli import common, main

__all__ = ["embedded_store", "run_main"]


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ without ORCH_ variables, plus `env`; as it was afterwards."""
    saved = dict(os.environ)
    try:
        for name in [name for name in os.environ if name.startswith("ORCH_")]:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_main(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`orchestrator ARGS` through `main()`: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(env or {}))
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(mock.patch.object(common, "_loaded", None))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: a usage error (2) or --help (0)
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(
        ["orchestrator", *args], code, out.getvalue(), err.getvalue()
    )


def embedded_store(home: Path) -> str:
    """A migrated embedded store (SQLite) in `home`, made here, as the CLI finds it there with
    `ORCH_HOME`: its URL."""
    from orchestrator.store import migrations

    home.mkdir()
    store = f"sqlite:///{home / 'orchestrator.db'}"
    migrations.upgrade(store)
    return store
