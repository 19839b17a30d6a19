"""Bad input and an unusable store, through the `orchestrator` CLI.

The rule: a clear line and a non-zero exit, never a traceback, never a partial write, never the
password of the store's URL. One real process per kind of failure (a bad argument, a store that
does not answer, one never migrated, a task not found, an argument that is not UTF-8) and the
commands that set up logging of their own; the cases that differ from those only in their
arguments run through the CLI's `main()` in this process (`tests.cli_in_process`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.acceptance.fleet import ORCHESTRATOR
from tests.cli_in_process import run_main
from tests.services import refused_port

PASSWORD = "s3cret-Pa55word"
REPO = Path(__file__).resolve().parents[2]

Run = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    # This checkout's code, not the one the virtualenv's editable install points at.
    merged["PYTHONPATH"] = str(REPO)
    merged.update(env or {})
    return subprocess.run(
        [ORCHESTRATOR, *args], capture_output=True, text=True, env=merged, cwd=cwd, timeout=120
    )


def one_clear_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a refused command, after checking the exit code."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    return lines[0]


def with_password(url: str) -> str:
    """The same URL with a password (the test servers trust loopback, so it is ignored)."""
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded store migrated once by `orchestrator db upgrade`, copied for each test."""
    home = tmp_path_factory.mktemp("template") / "home"
    result = run_main("db", "upgrade", env={"ORCH_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    return home / "orchestrator.db"


@pytest.fixture
def embedded(migrated: Path, tmp_path: Path) -> Run:
    """The CLI, in this process, on a fresh migrated embedded store in `tmp_path/home`."""
    (tmp_path / "home").mkdir()
    shutil.copyfile(migrated, tmp_path / "home" / "orchestrator.db")
    env = {"ORCH_HOME": str(tmp_path / "home")}

    def _run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_main(*args, env=env, cwd=tmp_path)

    return _run


@pytest.fixture
def embedded_process(migrated: Path, tmp_path: Path) -> Run:
    """The same, as a real process."""
    (tmp_path / "home").mkdir()
    shutil.copyfile(migrated, tmp_path / "home" / "orchestrator.db")
    env = {"ORCH_HOME": str(tmp_path / "home")}

    def _run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env, cwd=tmp_path)

    return _run


def task_count(tmp_path: Path) -> int:
    """Tasks in the embedded store of `embedded`, read without the CLI."""
    with contextlib.closing(sqlite3.connect(tmp_path / "home" / "orchestrator.db")) as conn:
        return int(conn.execute("SELECT count(*) FROM tasks").fetchone()[0])


# --- 1. an unusable store -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "run"),
    [
        (("tasks", "list"), run_cli),
        (("tasks", "show", "t1"), run_main),
        (("invocations", "show", "X"), run_main),
        (("cleanup",), run_main),
        # These two set up logging of their own: the process's stderr is theirs.
        (("recover",), run_cli),
        (("sweeper", "--once"), run_cli),
        (("actions", "list"), run_main),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else value.__name__,
)
def test_a_store_never_migrated_is_one_line_naming_db_upgrade(
    args: tuple[str, ...], run: Run, tmp_path: Path
) -> None:
    store = tmp_path / "empty.db"
    store.touch()
    result = run(*args, env={"ORCH_DATABASE_URL": f"sqlite:///{store}"}, cwd=tmp_path)
    line = one_clear_line(result, 1)
    assert str(store) in line
    assert "not migrated" in line
    assert "orchestrator db upgrade" in line


def test_an_empty_postgres_database_is_one_line_without_the_password(pg_empty_url: str) -> None:
    for args in (("tasks", "list"), ("invocations", "show", "X"), ("cleanup",)):
        result = run_main(*args, env={"ORCH_DATABASE_URL": with_password(pg_empty_url)})
        line = one_clear_line(result, 1)
        assert "not migrated" in line
        assert "***" in line  # the URL is shown, its password masked


def test_a_postgres_that_is_down_is_one_line_without_the_password(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://orch:{PASSWORD}@127.0.0.1:{refused_port()}/orch"
    trigger = ("tasks", "trigger", "--type", "leak", "--title", "x")
    for args, run in ((("tasks", "list"), run_cli), (trigger, run_main)):
        result = run(*args, env={"ORCH_DATABASE_URL": url}, cwd=tmp_path)
        line = one_clear_line(result, 1)
        assert "postgresql+psycopg://orch:***@127.0.0.1" in line
        assert "unavailable" in line


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://orch@127.0.0.1:{{port}}/orch?password={PASSWORD}",
        f"postgresql+psycopg:///orch?host=127.0.0.1&port={{port}}&user=orch&password={PASSWORD}",
        f"postgresql+psycopg://orch@127.0.0.1:{{port}}/orch?sslpassword={PASSWORD}&sslmode=bogus",
    ],
    ids=["password", "all-in-the-query", "sslpassword"],
)
def test_a_password_in_the_url_query_is_masked_too(url: str, tmp_path: Path) -> None:
    result = run_main(
        "tasks", "list", env={"ORCH_DATABASE_URL": url.format(port=refused_port())}, cwd=tmp_path
    )
    line = one_clear_line(result, 1)
    assert PASSWORD not in line
    assert "password=***" in line


def test_a_value_the_store_refuses_is_exit_2_and_writes_nothing(pg_url: str) -> None:
    # Postgres refusing a value (SQLSTATE class 22, data_exception) reaches the CLI as a
    # DataError; a trigger on the table stands in for any value the store cannot hold.
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'value refused by the store' "
            "USING ERRCODE = 'invalid_text_representation'; "
            "END $$ LANGUAGE plpgsql"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    env = {"ORCH_DATABASE_URL": with_password(pg_url)}
    result = run_main("tasks", "trigger", "--type", "leak", "--title", "x", env=env)
    line = one_clear_line(result, 2)
    assert "the store refused a value: value refused by the store" in line
    listed = run_main("tasks", "list", "--json", env=env)
    assert json.loads(listed.stdout) == []


def test_a_negative_limit_on_postgres_is_exit_2(pg_url: str) -> None:
    result = run_main("tasks", "list", "--limit", "-1", env={"ORCH_DATABASE_URL": pg_url})
    assert result.returncode == 2
    assert "--limit" in result.stderr
    assert "Traceback" not in result.stderr


# --- 2. bounded --limit and --batch-size; context files ---------------------------------------


@pytest.mark.parametrize("value", ["-1", "0", "201", "many", "99999999999999999999"])
def test_limit_is_bounded_like_the_api(embedded: Run, value: str) -> None:
    result = embedded("tasks", "list", "--limit", value)
    assert result.returncode == 2
    assert "argument --limit" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_argument_is_one_line_and_exit_2_from_a_real_process(
    embedded_process: Run,
) -> None:
    line = one_clear_line(embedded_process("tasks", "list", "--limit", "0"), 2)
    assert line == (
        "orchestrator tasks list: argument --limit: must be between 1 and 200, not 0 "
        "(see orchestrator tasks list --help)"
    )


def test_a_task_not_found_is_one_line_and_exit_1_from_a_real_process(
    embedded_process: Run,
) -> None:
    result = embedded_process("tasks", "show", "no-such-task")
    line = one_clear_line(result, 1)
    assert line == "orchestrator: not_found: task no-such-task does not exist"
    assert result.stdout == ""


def test_the_largest_limit_is_accepted(embedded: Run) -> None:
    result = embedded("tasks", "list", "--limit", "200")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("value", ["0", "-5", "99999999999999999999"])
def test_cleanup_batch_size_is_bounded(embedded: Run, value: str) -> None:
    result = embedded("cleanup", "--batch-size", value)
    assert result.returncode == 2
    assert "argument --batch-size" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"level": NaN}', "holds the number NaN"),
        ('{"level": Infinity}', "holds the number Infinity"),
        ('{"level": [-Infinity]}', "holds the number -Infinity"),
        ('{"level": 1e400}', "holds the number 1e400"),
        ('{"note": "a\\u0000b"}', "NUL character"),
        ('{"deep": [{"k\\u0000": 1}]}', "NUL character"),
        ('{"note": "\\ud800"}', "unpaired surrogate"),
        ("[1, 2]", "must hold a JSON object, not an array"),
        ('"text"', "must hold a JSON object, not a string"),
        ("null", "must hold a JSON object, not null"),
        ("{oops", "is not JSON"),
    ],
)
@pytest.mark.parametrize("flag", ["--context-file", "--sample-input-file"])
def test_a_bad_json_file_is_one_line_exit_2_and_nothing_written(
    embedded: Run, tmp_path: Path, content: str, needle: str, flag: str
) -> None:
    (tmp_path / "in.json").write_text(content, encoding="utf-8")
    result = embedded("tasks", "trigger", "--type", "leak", "--title", "Leak", flag, "in.json")
    line = one_clear_line(result, 2)
    assert needle in line
    assert "in.json" in line
    assert task_count(tmp_path) == 0


def test_a_missing_context_file_is_exit_2(embedded: Run) -> None:
    result = embedded(
        "tasks", "trigger", "--type", "x", "--title", "x", "--context-file", "no.json"
    )
    assert "cannot read context file" in one_clear_line(result, 2)


def test_a_good_context_file_is_still_accepted(embedded: Run, tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{"level": 1.5, "where": "北区", "tags": []}')
    result = embedded(
        "tasks", "trigger", "--type", "leak", "--title", "x", "--context-file", "c.json"
    )
    assert result.returncode == 0, result.stderr
    assert task_count(tmp_path) == 1


def test_an_argument_that_is_not_utf8_is_one_line_exit_2(embedded_process: Run) -> None:
    # b"a\xffb" on the command line arrives as "a\udcffb"; no store can take it.
    result = embedded_process("tasks", "show", "a\udcffb")
    assert "not valid UTF-8" in one_clear_line(result, 2)


# --- 3. requeue and cancel reasons, as the API checks them -----------------------------------


@pytest.fixture
def task_id(embedded: Run) -> str:
    made = embedded("tasks", "trigger", "--type", "leak", "--title", "Leak", "--json")
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["task_id"])


@pytest.mark.parametrize(
    ("verb", "reason", "needle"),
    [
        ("requeue", "", "at least 1 character"),
        ("requeue", "r" * 501, "at most 500 characters"),
        ("cancel", "", "at least 1 character"),
        ("cancel", "c" * 501, "at most 500 characters"),
    ],
)
def test_a_reason_outside_1_to_500_characters_is_refused(
    embedded: Run, task_id: str, verb: str, reason: str, needle: str
) -> None:
    result = embedded("tasks", verb, task_id, "--reason", reason)
    line = one_clear_line(result, 2)
    assert "--reason" in line
    assert needle in line
    view = json.loads(embedded("tasks", "show", task_id, "--json").stdout)
    assert (view["status"], view["generation"]) == ("queued", 1)


def test_a_reason_of_500_characters_is_accepted(embedded: Run, task_id: str) -> None:
    result = embedded("tasks", "requeue", task_id, "--reason", "r" * 500)
    assert result.returncode == 0, result.stderr
    assert "generation 2" in result.stdout


def test_a_worker_name_celery_cannot_expand_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_main("worker", "--name", "w@%h%Q", env={"ORCH_HOME": str(tmp_path / "home")})
    assert "--name" in one_clear_line(result, 2)


def test_a_worker_concurrency_below_one_is_exit_2(tmp_path: Path) -> None:
    result = run_main("worker", "--concurrency", "0", env={"ORCH_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--concurrency" in result.stderr.strip().splitlines()[-1]
