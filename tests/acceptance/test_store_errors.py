"""A store error says what is wrong: no such database, no such user, a refused password, an
unreachable host, not migrated; only the last one sends the operator to `db upgrade`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.cli.store_errors import describe_store_error
from orchestrator.store.migrations import downgrade, upgrade
from tests.acceptance.fleet import ORCHESTRATOR
from tests.services import PostgresServer


def run(url: str, tmp_path: Path, *command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_DATABASE_URL"] = url
    result = subprocess.run(
        [ORCHESTRATOR, *(command or ("tasks", "list"))],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("database", "user", "expected"),
    [
        ("no_such_db", "postgres", "has no such database"),
        ("postgres", "no_such_user", "no such user"),
    ],
)
def test_postgres_errors_name_the_cause(
    postgres: PostgresServer, tmp_path: Path, database: str, user: str, expected: str
) -> None:
    url = postgres.url(database).replace("//postgres@", f"//{user}:pw@")
    assert f"//{user}:pw@" in url
    line = run(url, tmp_path)
    assert expected in line
    assert "db upgrade" not in line
    assert ":pw@" not in line


def test_a_refused_password_is_named_as_such() -> None:
    # The driver's own message for a password that pg_hba's scram check refused.
    orig = psycopg.OperationalError(
        'connection failed: FATAL:  password authentication failed for user "orch"'
    )
    error = OperationalError("SELECT 1", {}, orig)
    line = describe_store_error(error)
    assert "authentication failed" in line
    assert "db upgrade" not in line


def test_a_store_one_migration_behind_is_sent_to_db_upgrade(store_url: str, tmp_path: Path) -> None:
    """The package upgraded, the store not yet: a command that reads a column the store lacks
    says so and sends the operator to `db upgrade`, where it said the store was "unavailable"
    (SQLite) or had "failed" (Postgres)."""
    downgrade(store_url, "0013")  # before `outbox.throttled`
    line = run(store_url, tmp_path, "outbox", "list")
    assert "is not migrated to this code's schema: run `orchestrator db upgrade`" in line
    assert "throttled" in line  # the driver's own words name the column
    upgrade(store_url)
    assert run_ok(store_url, tmp_path, "outbox", "list") == "no deliveries"


def run_ok(url: str, tmp_path: Path, *command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_DATABASE_URL"] = url
    result = subprocess.run(
        [ORCHESTRATOR, *command], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
