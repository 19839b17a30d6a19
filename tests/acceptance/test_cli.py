"""The `orchestrator` console script as a real process, against both stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.store import migrations

ORCHESTRATOR = str(Path(sys.executable).with_name("orchestrator"))


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    merged.update(env or {})
    return subprocess.run(
        [ORCHESTRATOR, *args], capture_output=True, text=True, env=merged, cwd=cwd, timeout=120
    )


def test_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert "db" in result.stdout


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_db_upgrade_then_downgrade(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'cli.db'}"
    else:
        url = str(request.getfixturevalue("pg_empty_url"))
    env = {"ORCH_DATABASE_URL": url}
    up = run("db", "upgrade", env=env)
    assert up.returncode == 0, up.stderr
    head = migrations.head_revision()
    assert f"store at revision {head}" in up.stdout
    current = run("db", "current", "--json", env=env)
    assert json.loads(current.stdout) == {"current": head, "head": head}
    down = run("db", "downgrade", "base", env=env)
    assert down.returncode == 0, down.stderr
    assert "store at revision base" in down.stdout


def test_embedded_default_needs_no_configuration(tmp_path: Path) -> None:
    result = run("db", "upgrade", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".orchestrator" / "orchestrator.db").is_file()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCH_LEASE_RENEW_SECONDS", "500"),
        ("ORCH_LEASE_SECONDS", "-1"),
        ("ORCH_DATABASE_URL", "mysql://nope"),
        ("ORCH_DATABASE_URL", "::not a url::"),
        ("ORCH_REDIS_URL", "http://localhost"),
        ("DATA_CLEANUP_ENABLE", "perhaps"),
    ],
)
def test_bad_setting_stops_with_one_clear_line(name: str, value: str, tmp_path: Path) -> None:
    result = run("db", "upgrade", env={name: value}, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / ".orchestrator").exists()
