"""The leak locator (tests.leaks, hooked in tests/conftest.py) fails the test that dropped a
resource open, in its own teardown, naming what and where: not the later test the garbage
collector's warning would fail under `filterwarnings = error`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

INNER = """
import os
import socket

from orchestrator.store import Database


def test_drops_an_engine():
    db = Database.from_url(os.environ["LEAK_PG_URL"])
    with db.transaction():
        pass


def test_after_the_engine():
    pass


def test_drops_a_socket():
    sock = socket.socket()
    cycle = [sock]
    cycle.append(cycle)


def test_closes_its_engine():
    db = Database.from_url(os.environ["LEAK_PG_URL"])
    with db.transaction():
        pass
    db.dispose()
"""


def test_the_test_that_drops_an_engine_or_a_socket_open_fails_naming_it(
    pg_url: str, tmp_path: Path
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER, encoding="utf-8")
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
    assert "4 passed, 2 errors" in out, out
    errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
    assert [line.split(" - ")[0] for line in errors] == [
        "ERROR test_inner.py::test_drops_an_engine",
        "ERROR test_inner.py::test_drops_a_socket",
    ], out
    engine, socket_ = out.split("ERROR at teardown of test_drops_an_engine")[1].split(
        "ERROR at teardown of test_drops_a_socket"
    )
    database = pg_url.rsplit("/", 1)[1]
    assert f"psycopg connection to database {database!r} opened in test_inner.py::" in engine
    assert "test_drops_an_engine (call), at orchestrator/store/db.py:" in engine
    assert "ResourceWarning: unclosed <socket.socket" in socket_
