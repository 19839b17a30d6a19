"""Processes started against a schema that is behind or ahead of their code say so, and what to do.

Behind: the sweeper loop logged `sweep failed (ProgrammingError: column ... does not exist)` every
few seconds, never naming `db upgrade`; now each such line does (the loop still sweeps on, so
migrating the store mends it). Ahead (a newer orchestrator migrated the store during a rolling
upgrade): the worker told the operator to run `orchestrator db upgrade`, which then failed with
`Can't locate revision identified by '0017'` as if they had typed a bad revision (exit 2); now
they and the sweeper (which swept on) say the store is newer than this code and to run
the newer version.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.store import migrations
from orchestrator.store.db import make_engine
from tests.acceptance.fleet import ORCHESTRATOR, Fleet, fleet_env, running_fleet
from tests.executions_support import wait_for

AHEAD = "0999"


@pytest.fixture
def fleet(pg_empty_url: str, redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    (tmp_path / "scripts").mkdir()
    model = {"ORCH_MODEL": f"scripted:{tmp_path / 'scripts'}"}
    env = fleet_env(pg_empty_url, redis_url, tmp_path) | model
    with running_fleet(env, tmp_path) as running:
        yield running


def _stamp(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    finally:
        engine.dispose()


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_a_store_migrated_by_newer_code_is_named_as_such_not_sent_to_db_upgrade(
    fleet: Fleet, pg_empty_url: str
) -> None:
    migrations.upgrade(pg_empty_url)
    _stamp(pg_empty_url, AHEAD)
    head = migrations.head_revision()

    worker = fleet.cli("worker", "--concurrency", "1")
    assert worker.returncode == 1, worker.stderr
    line = _one_line(worker)
    assert f"at revision {AHEAD}, newer than this code's newest ({head})" in line, line
    assert "db upgrade" not in line

    upgrade = fleet.cli("db", "upgrade")
    assert upgrade.returncode == 1, upgrade.stderr
    line = _one_line(upgrade)
    assert f"at revision {AHEAD}, newer than this code's newest ({head})" in line, line
    assert "Can't locate" not in line

    current = fleet.cli("db", "current")
    assert current.returncode == 0, current.stderr
    assert current.stdout.strip() == f"current {AHEAD} (head {head}): newer than this code"


def test_the_sweeper_says_to_run_db_upgrade_when_the_store_is_behind(
    fleet: Fleet, pg_empty_url: str
) -> None:
    # The loop sweeps on (the store may be migrated while it runs), and each failure says how.
    migrations.upgrade(pg_empty_url, "0012")
    sweeper = fleet.sweeper()
    wait_for(lambda: "sweep failed" in fleet.logs(), 20, what="a failed sweep")
    assert sweeper.poll() is None
    line = next(line for line in fleet.logs().splitlines() if "sweep failed" in line)
    assert "is not migrated to this code's schema: run `orchestrator db upgrade`" in line, line


def test_the_sweeper_refuses_a_store_migrated_by_newer_code_at_start(
    fleet: Fleet, pg_empty_url: str
) -> None:
    migrations.upgrade(pg_empty_url)
    _stamp(pg_empty_url, AHEAD)
    try:
        sweeper = subprocess.run(
            [ORCHESTRATOR, "sweeper"],
            env={k: v for k, v in os.environ.items() if not k.startswith("ORCH_")} | fleet.env,
            cwd=fleet.folder,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the sweeper kept running on a store at {AHEAD}: {exc.stderr!r}")
    assert sweeper.returncode == 1, sweeper.stderr
    line = _one_line(sweeper)
    assert f"at revision {AHEAD}, newer than this code's newest" in line, line
