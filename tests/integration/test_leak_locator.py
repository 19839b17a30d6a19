"""The leak locator (tests.leaks, hooked in tests/conftest.py) fails the file whose test dropped
a resource open, in the teardown of its last test, naming what and (for a psycopg connection)
the test and line that opened it: not the later test that the garbage collector's warning would
fail under `filterwarnings = error`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ENGINE = """
import os

from orchestrator.store import Database


def test_drops_an_engine():
    db = Database.from_url(os.environ["LEAK_PG_URL"])
    with db.transaction():
        pass


def test_after_the_engine():
    pass
"""

SOCKET = """
import socket


def test_drops_a_socket():
    sock = socket.socket()
    cycle = [sock]
    cycle.append(cycle)


def test_after_the_socket():
    pass
"""

CLEAN = """
import os

from orchestrator.store import Database


def test_closes_its_engine():
    db = Database.from_url(os.environ["LEAK_PG_URL"])
    with db.transaction():
        pass
    db.dispose()
"""


def test_the_file_whose_test_drops_an_engine_or_a_socket_open_fails_naming_it(
    pg_url: str, tmp_path: Path
) -> None:
    for name, text in {"engine": ENGINE, "socket": SOCKET, "clean": CLEAN}.items():
        (tmp_path / f"test_{name}.py").write_text(text, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import *  # noqa: F403  (the suite's hooks and fixtures)\n",
        encoding="utf-8",
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA"],
        cwd=tmp_path,
        env=os.environ | {"LEAK_PG_URL": pg_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = run.stdout
    errors = [line.split(" - ")[0] for line in out.splitlines() if line.startswith("ERROR ")]
    assert errors == [
        "ERROR test_engine.py::test_after_the_engine",
        "ERROR test_socket.py::test_after_the_socket",
    ], out
    assert "5 passed, 2 errors" in out, out
    engine, socket_ = out.split("ERROR at teardown of test_after_the_engine")[1].split(
        "ERROR at teardown of test_after_the_socket"
    )
    database = pg_url.rsplit("/", 1)[1]
    assert (
        f"psycopg connection to database {database!r} opened in "
        "test_engine.py::test_drops_an_engine (call), at orchestrator/store/db.py:"
    ) in engine
    assert "ResourceWarning: unclosed <socket.socket" in socket_
