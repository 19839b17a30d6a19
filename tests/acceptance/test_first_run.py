"""A first run as the README and docs/cli.md tell it: bad flags, a closed pipe, a broker that is
down or silent, an unmigrated store and a misspelt setting each end in one line, never a
traceback or a hang."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.store import migrations
from orchestrator.store.db import Database
from tests.acceptance.fleet import ORCHESTRATOR
from tests.services import refused_port


def run(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    merged["ORCH_HOME"] = str(home)
    merged.update(env or {})
    return subprocess.run(
        [ORCHESTRATOR, *args],
        capture_output=True,
        text=True,
        env=merged,
        cwd=home.parent,
        timeout=timeout,
    )


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("api", "--port", "99999"), "--port"),
        (("api", "--log-level", "bogus"), "--log-level"),
        (("worker", "--loglevel", "bogus"), "--loglevel"),
        (("worker", "--concurrency", "-1"), "--concurrency"),
        (("db", "upgrade", "9999"), "9999"),
        (("tasks", "list", "--limit", "0"), "--limit"),
    ],
)
def test_a_bad_flag_or_value_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    line = one_line(run(*args, home=tmp_path / "home"), 2)
    assert named in line


@pytest.fixture
def migrated_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    migrations.upgrade(f"sqlite:///{home / 'orchestrator.db'}")
    return home


def test_tasks_list_into_head_ends_quietly(migrated_home: Path) -> None:
    db = Database.from_url(f"sqlite:///{migrated_home / 'orchestrator.db'}")
    service = TaskService(db, RecordingDispatcher())
    for n in range(200):  # well over a pipe buffer of JSON
        service.trigger(Trigger(task_type="demo", title=f"task {n} " + "x" * 150))
    db.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(migrated_home)
    result = subprocess.run(
        f"{ORCHESTRATOR} tasks list --json --limit 200 | head -n 3",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == "["
    assert result.stderr == "", result.stderr


@pytest.fixture
def silent_redis() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize("broker", ["down", "silent"])
def test_trigger_with_the_broker_unreachable_says_the_sweeper_sends_it(
    migrated_home: Path, broker: str, request: pytest.FixtureRequest
) -> None:
    port = refused_port() if broker == "down" else request.getfixturevalue("silent_redis")
    started = time.monotonic()
    result = run(
        "tasks",
        "trigger",
        "--type",
        "demo",
        "--title",
        "t",
        home=migrated_home,
        env={"ORCH_REDIS_URL": f"redis://127.0.0.1:{port}/0"},
    )
    assert time.monotonic() - started < 30  # bounded timeouts, never a hang
    line = one_line(result, 0)  # the task is stored and will run
    assert "the sweeper sends the wake-up" in line
    task_id = result.stdout.split()[2]
    assert task_id in line
    assert len(task_id) == 36


def test_the_worker_refuses_an_unmigrated_store(tmp_path: Path) -> None:
    model = {"ORCH_MODEL": f"scripted:{tmp_path}"}  # a usable model: the store is what is wrong
    line = one_line(run("worker", "--concurrency", "1", home=tmp_path / "home", env=model), 1)
    assert "not migrated" in line
    assert "orchestrator db upgrade" in line


def test_the_worker_refuses_a_store_it_cannot_reach(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://orch:pw@127.0.0.1:{refused_port()}/orch"
    env = {"ORCH_DATABASE_URL": url, "ORCH_MODEL": f"scripted:{tmp_path}"}
    result = run("worker", home=tmp_path / "home", env=env)
    line = one_line(result, 1)
    assert "cannot reach the database host" in line
    assert "db upgrade" not in line
    assert ":pw@" not in line


def test_a_misspelt_setting_is_named_in_a_warning(migrated_home: Path) -> None:
    result = run("tasks", "list", home=migrated_home, env={"ORCH_DATABSE_URL": "sqlite://"})
    assert result.returncode == 0, result.stderr
    assert "ORCH_DATABSE_URL is not a setting" in result.stderr
    assert "ORCH_DATABASE_URL?" in result.stderr


def test_a_misspelt_setting_in_the_env_file_is_named_in_a_warning(migrated_home: Path) -> None:
    # The settings read `.env` in the working directory: a typo there is as silent otherwise.
    (migrated_home.parent / ".env").write_text("ORCH_LEASE_SECOND=90\n")
    result = run("tasks", "list", home=migrated_home)
    assert result.returncode == 0, result.stderr
    assert "ORCH_LEASE_SECOND is not a setting" in result.stderr
    assert "ORCH_LEASE_SECONDS?" in result.stderr


def test_sweeper_once_does_not_promise_a_period(migrated_home: Path) -> None:
    result = run("sweeper", "--once", home=migrated_home)
    assert result.returncode == 0, result.stderr
    assert "every" not in result.stdout
    assert "sweeping once" in result.stdout
    assert (migrated_home / "sweeper.heartbeat").is_file()  # what the compose health check reads
