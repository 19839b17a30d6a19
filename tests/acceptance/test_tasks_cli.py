"""`orchestrator tasks ...` on the embedded default.

Through the CLI's `main()` in this process (`tests.cli_in_process`), but for what a real process
shows: the lines the broker's and Redis's failures leave on stderr (logging's last resort
there). The real-process cases of bad input and a task not found are in `test_cli_errors`.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.runtime import build_runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from tests.acceptance.fleet import ORCHESTRATOR
from tests.cli_in_process import run_main
from tests.services import refused_port

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """`orchestrator ARGS` in the test's folder, in this process; `settings` are extra ORCH_
    variables."""

    def _run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
        return run_main(*args, env=settings, cwd=tmp_path)

    assert _run("db", "upgrade").returncode == 0
    return _run


@pytest.fixture
def run_process(run: Run, tmp_path: Path) -> Run:
    """The same as a real process (on the store `run` migrated)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}

    def _run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ORCHESTRATOR, *args],
            cwd=tmp_path,
            env=env | settings,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return _run


def test_trigger_list_show_requeue_cancel(run: Run, tmp_path: Path) -> None:
    (tmp_path / "ctx.json").write_text('{"district": "north"}')
    made = run(
        "tasks",
        "trigger",
        "--type",
        "leak",
        "--title",
        "Leak",
        "--context-file",
        "ctx.json",
        "--trigger-id",
        "k1",
        "--json",
    )
    assert made.returncode == 0, made.stderr
    task = json.loads(made.stdout)
    assert (task["status"], task["created"]) == ("queued", True)
    same = ("--type", "leak", "--title", "Leak", "--context-file", "ctx.json", "--trigger-id", "k1")
    again = run("tasks", "trigger", *same)
    assert again.returncode == 0
    assert "already exists" in again.stdout

    listed = run("tasks", "list")
    assert task["task_id"] in listed.stdout

    shown = json.loads(run("tasks", "show", task["task_id"], "--json").stdout)
    assert shown["executions"][0]["generation"] == 1
    page = run("tasks", "show", task["task_id"]).stdout
    assert "generations:" in page

    requeued = run("tasks", "requeue", task["task_id"], "--reason", "fresh look")
    assert "generation 2" in requeued.stdout
    ended = json.loads(run("tasks", "show", task["task_id"], "--json").stdout)["executions"]
    first = next(e for e in ended if e["generation"] == 1)
    assert first["reason"] == f"requeued by {getpass.getuser()}: fresh look"  # who asked
    unnamed = run("tasks", "cancel", task["task_id"], "--by", "")
    assert (unnamed.returncode, unnamed.stdout) == (2, "")  # an empty --by is refused
    assert unnamed.stderr.startswith("orchestrator: invalid --by")
    cancelled = run("tasks", "cancel", task["task_id"], "--by", "night desk", "--json")
    assert json.loads(cancelled.stdout)["last_error"] == "cancelled by night desk"
    twice = run("tasks", "cancel", task["task_id"])
    assert twice.returncode == 1
    assert "invalid_transition" in twice.stderr
    assert "Traceback" not in twice.stderr


def test_unknown_task_is_one_line_and_exit_1(run: Run) -> None:
    result = run("tasks", "show", "no-such-task")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "orchestrator: not_found: task no-such-task does not exist"
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--context-file", "missing.json"), "cannot read context file"),
        (("--context-file", "bad.json"), "is not JSON"),
        (("--context-file", "list.json"), "must hold a JSON object"),
    ],
)
def test_bad_trigger_input_is_a_clear_line(
    run: Run, tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "list.json").write_text("[1]")
    result = run("tasks", "trigger", "--type", "leak", "--title", "Leak", *args)
    assert result.returncode != 0
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert "no tasks" in run("tasks", "list").stdout


def test_bad_task_type_is_refused_before_anything_is_written(run: Run) -> None:
    result = run("tasks", "trigger", "--type", "../../etc/passwd", "--title", "x")
    assert result.returncode == 2
    assert "task_type" in result.stderr
    assert "no tasks" in run("tasks", "list").stdout


def test_transcript_of_a_task_and_its_errors(run: Run) -> None:
    created = run("tasks", "trigger", "--type", "water", "--title", "t", "--json")
    task_id = json.loads(created.stdout)["task_id"]
    shown = run("tasks", "transcript", task_id)
    assert shown.returncode == 0, shown.stderr
    assert "(no model turn recorded)" in shown.stdout
    as_json = json.loads(run("tasks", "transcript", task_id, "--json").stdout)
    assert as_json["items"] == []
    unknown = run("tasks", "transcript", "no-such-task")
    assert unknown.returncode == 1
    assert len(unknown.stderr.strip().splitlines()) == 1
    missing = run("tasks", "transcript", task_id, "--generation", "5")
    assert missing.returncode == 1
    assert "no generation 5" in missing.stderr
    bad = run("tasks", "transcript", task_id, "--generation", "0")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr


def test_a_trigger_the_broker_refuses_says_why_without_the_password(run_process: Run) -> None:
    made = run_process(
        "tasks",
        "trigger",
        "--type",
        "leak",
        "--title",
        "Leak",
        ORCH_REDIS_URL=f"redis://:Broker-s3cret@127.0.0.1:{refused_port()}/0",
    )
    assert made.returncode == 0  # stored, and it will run: as a requeue
    assert "stored task" in made.stdout
    (line,) = made.stderr.strip().splitlines()
    assert "the broker did not take the wake-up" in line
    assert "the task is stored and will run" in line
    assert "Connection refused" in line  # why, not only that
    assert "Broker-s3cret" not in made.stdout + made.stderr


def test_with_redis_down_a_requeue_and_a_cancel_each_say_it_in_one_line(
    run_process: Run, tmp_path: Path
) -> None:
    """A change's notices for task streams and running rounds go over Redis after it commits.
    With Redis down, the events module's warning, worded for a worker's log ("2 change
    notice(s) for streams and running rounds not published over Redis ..."), was printed by
    logging's last resort beside the command's own line (a requeue's), or alone (a cancel's).
    Now one line of the command's: the broker's when the wake-up was refused too, else the
    notice's."""
    # Triggered in this process (one process less to start): the CLI's embedded store.
    rt = build_runtime(
        load_settings(home=tmp_path / ".orchestrator"), dispatcher=RecordingDispatcher()
    )
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Leak")).task.task_id
    finally:
        rt.close()
    down = {"ORCH_REDIS_URL": f"redis://:Broker-s3cret@127.0.0.1:{refused_port()}/0"}

    requeued = run_process("tasks", "requeue", task_id, "--reason", "again", "--by", "op", **down)
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout == f"requeued task {task_id} as generation 2\n"
    (line,) = requeued.stderr.strip().splitlines()
    assert line.startswith(f"orchestrator: the broker did not take the wake-up of task {task_id}")

    cancelled = run_process("tasks", "cancel", task_id, "--reason", "done", "--by", "op", **down)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"cancelled task {task_id} (generation 2 fenced)\n"
    (line,) = cancelled.stderr.strip().splitlines()
    assert line.startswith("orchestrator: Redis did not take the notice of the cancel (")
    assert "Connection refused" in line  # why, not only that
    assert line.endswith(
        "; the cancel is committed: task streams show it at their next poll, and a round "
        "running elsewhere stops at its next lease renewal"
    )
    assert "Broker-s3cret" not in requeued.stderr + cancelled.stderr
