"""The CLI's start-up imports what its parser needs, not the runtime behind every command.

An operator pays every import on each `orchestrator tasks list`, and the suite starts hundreds
of CLI processes: the agent and its tools, Alembic, Celery, FastAPI and redis-py are imported
by the commands that use them (a worker, the demo, `db`, `api`, a Redis store), not by all.
Each case runs in a fresh interpreter: this process has imported them all already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.services.tasks import Trigger

ROOT = Path(__file__).resolve().parent.parent.parent

#: Never imported to build the parser or to print a command's help.
NOT_AT_START = (
    "orchestrator.agent",
    "orchestrator.tools",
    "orchestrator.api",
    "alembic",
    "celery",
    "kombu",
    "fastapi",
    "uvicorn",
    "redis",
    "workers",
)

PROBE = """
import contextlib, io, json, sys
from orchestrator.cli import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def _imported(argv: list[str], home: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=60,
    )
    assert done.stdout, done.stderr
    found: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    found["err"] = done.stderr
    return found


def _loaded(modules: object, prefix: str) -> list[str]:
    assert isinstance(modules, list)
    return [name for name in modules if name == prefix or name.startswith(prefix + ".")]


#: Nor what only a command that runs needs: the store, the settings, the HTTP client. `--help`
#: imported them all (SQLAlchemy, pydantic, psycopg, httpx: 700 modules, about a second).
NOT_FOR_HELP = (
    *NOT_AT_START,
    "sqlalchemy",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "httpx",
    "orchestrator.settings",
    "orchestrator.store",
    "orchestrator.services",
    "orchestrator.runtime",
)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["tasks", "--help"],
        ["tasks", "list", "--help"],
        ["actions", "--help"],
        ["outbox", "--help"],
        ["worker", "--help"],
        ["db", "--help"],
    ],
    ids=" ".join,
)
def test_the_parser_and_a_commands_help_leave_the_runtime_unimported(
    argv: list[str], tmp_path: Path
) -> None:
    found = _imported(argv, tmp_path / "home")
    assert found["code"] == 0
    assert "usage: orchestrator" in str(found["out"])
    loaded = {prefix: _loaded(found["modules"], prefix) for prefix in NOT_FOR_HELP}
    assert {prefix: names for prefix, names in loaded.items() if names} == {}


def test_a_usage_error_is_said_without_the_runtime(tmp_path: Path) -> None:
    found = _imported(["tasks", "list", "--limit", "0"], tmp_path / "home")
    assert found["code"] == 2
    assert "--limit: must be between 1 and 200, not 0" in str(found["err"])
    loaded = {prefix: _loaded(found["modules"], prefix) for prefix in NOT_FOR_HELP}
    assert {prefix: names for prefix, names in loaded.items() if names} == {}


def test_a_listing_and_a_lookup_read_the_store_without_the_broker_or_the_agent(
    tmp_path: Path,
) -> None:
    """Nor does a command that reads an embedded store: the broker is for wake-ups; nor
    httpx, which the settings need only to check a URL that is set (0.13 s of each start)."""
    from tests.cli_in_process import embedded_store

    home = tmp_path / "home"
    embedded_store(home)
    listed = _imported(["tasks", "list"], home)
    assert (listed["code"], listed["out"]) == (0, "no tasks\n"), listed["err"]
    shown = _imported(["tasks", "show", "no-such-task"], home)
    assert shown["code"] == 1
    assert "not_found" in str(shown["err"])
    for found in (listed, shown):
        loaded = {prefix: _loaded(found["modules"], prefix) for prefix in (*NOT_AT_START, "httpx")}
        assert {prefix: names for prefix, names in loaded.items() if names} == {}


#: What serves HTTP: a command that changes a task in the store has no use for it.
WEB = ("fastapi", "starlette", "uvicorn", "orchestrator.api")

#: What a task's explain view reads (`tasks show`): its plans, report, recovery snapshot, view
#: version and last write. `tasks list`, a trigger and a requeue imported them with the task
#: service (about 40 ms of each start). Its transcripts and deliveries are not listed: the
#: broker's Celery app imported them with the cleanup (`CLEANUP_ONLY`).
EXPLAIN_ONLY = (
    "orchestrator.services.task_explain",
    "orchestrator.services.recovery",
    "orchestrator.store.plans",
    "orchestrator.store.reports",
    "orchestrator.store.task_versions",
    "orchestrator.store.last_write",
)

#: What only the explain view's receipts read (`tasks show`): the runtime built the receipt
#: ledger with the task service, so every `tasks` command imported it (about 12 ms).
RECEIPTS_ONLY = ("orchestrator.store.receipts", "orchestrator.store.fastclaim")

#: What only the retention pass uses. The Celery app every trigger and requeue builds imported
#: it for its schedule's interval, one number (about 10 ms of each start).
CLEANUP_ONLY = (
    "orchestrator.services.cleanup",
    "orchestrator.store.outbox",
    "orchestrator.store.outbox_views",
    "orchestrator.store.outbox_retention",
    "orchestrator.store.transcripts",
)


def test_requeue_and_cancel_check_their_options_without_the_web_stack(tmp_path: Path) -> None:
    """`tasks requeue` and `tasks cancel` checked `--reason` and `--by` with the API's body
    models, imported from `orchestrator.api.tasks`: FastAPI, Starlette and the whole app (the
    package builds it) on every requeue. The same checks, the same lines, without them; and a
    requeue without what only a task's explain view reads."""
    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import TaskService, Trigger
    from orchestrator.store.db import Database
    from tests.cli_in_process import embedded_store, run_main

    home = tmp_path / "home"
    store = embedded_store(home)
    db = Database.from_url(store)
    try:
        task_id = (
            TaskService(db, RecordingDispatcher())
            .trigger(Trigger(task_type="demo", title="t"))
            .task.task_id
        )
    finally:
        db.dispose()
    requeued = _imported(["tasks", "requeue", task_id, "--reason", "again", "--by", "ana"], home)
    assert requeued["code"] == 0, requeued["err"]
    assert requeued["out"] == f"requeued task {task_id} as generation 2\n"
    cancelled = _imported(["tasks", "cancel", task_id, "--by", "ana"], home)
    assert cancelled["code"] == 0, cancelled["err"]
    assert cancelled["out"] == f"cancelled task {task_id} (generation 2 fenced)\n"
    for found in (requeued, cancelled):
        loaded = {prefix: _loaded(found["modules"], prefix) for prefix in WEB}
        assert {prefix: names for prefix, names in loaded.items() if names} == {}
    assert _any_of(requeued, EXPLAIN_ONLY) == {}
    # Refused as before, in the same words (in this process: only the words are checked).
    env = {"ORCH_HOME": str(home)}
    blank = run_main("tasks", "requeue", task_id, "--reason", " ", env=env)
    assert (blank.returncode, blank.stdout) == (2, "")
    assert blank.stderr.startswith("orchestrator: invalid --reason: ")
    assert blank.stderr.endswith("must not be blank\n")  # after pydantic's "Value error, "
    too_long = run_main("tasks", "cancel", task_id, "--by", "x" * 129, env=env)
    assert (too_long.returncode, too_long.stdout) == (2, "")
    # In characters, as --reason's (pydantic said "at most 200 items after validation"); 128,
    # as every `by` (tests/integration/test_operator_names.py).
    assert (
        too_long.stderr == "orchestrator: invalid --by: String should have at most 128 characters\n"
    )


def test_an_action_listed_or_shown_is_read_without_the_web_stack(tmp_path: Path) -> None:
    """`actions list` and `actions show` send a payload as the API does (`payload_as_sent`),
    imported from the API's response models: FastAPI, Starlette and the whole app for every
    page of actions with one on it."""
    from sqlalchemy import insert

    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import TaskService, Trigger
    from orchestrator.store.db import Database
    from orchestrator.store.tables import actions
    from orchestrator.store.types import utcnow
    from tests.cli_in_process import embedded_store

    home = tmp_path / "home"
    store = embedded_store(home)
    db = Database.from_url(store)
    try:
        task = TaskService(db, RecordingDispatcher()).trigger(Trigger(task_type="t", title="t"))
        row = {
            "action_id": "act-1",
            "task_id": task.task.task_id,
            "generation": 1,
            "session_id": task.task.session_id,
            "node_id": "a",
            "kind": "work_order",
            "payload": [1, 2],  # an older shape: sent as its JSON text
            "status": "approved",
            "decided_by": "ana",
            "decided_at": utcnow(),
            "created_at": utcnow(),
            "plan_revision": 1,
            "digest": "0" * 64,
        }
        with db.transaction() as conn:
            conn.execute(insert(actions), [row])
    finally:
        db.dispose()
    listed = _imported(["actions", "list", "--decided", "--json"], home)
    assert listed["code"] == 0, listed["err"]
    assert [(a["action_id"], a["payload"]) for a in json.loads(str(listed["out"]))] == [
        ("act-1", "[1, 2]")
    ]
    shown = _imported(["actions", "show", "act-1"], home)
    assert shown["code"] == 0, shown["err"]
    assert "    [1, 2]" in str(shown["out"])
    for found in (listed, shown):
        loaded = {prefix: _loaded(found["modules"], prefix) for prefix in WEB[:3]}
        assert {prefix: names for prefix, names in loaded.items() if names} == {}


#: Runs each command of argv lists in turn, in one interpreter: what each printed and what was
#: imported once it ended (a module stays imported: a later command's set holds every earlier's).
STEPS = """
import contextlib, io, json, sys
from orchestrator.cli import main
steps = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    steps.append(
        {"code": code, "out": out.getvalue(), "err": err.getvalue(), "modules": sorted(sys.modules)}
    )
print(json.dumps(steps))
"""

#: What sends a wake-up: imported by a command that sends one, and by no other.
BROKER = ("celery", "kombu", "redis", "workers")


def _steps(argvs: list[list[str]], home: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", STEPS, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=90,
    )
    assert done.stdout, done.stderr
    steps: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return steps


def _any_of(found: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    loaded = {prefix: _loaded(found["modules"], prefix) for prefix in prefixes}
    return {prefix: names for prefix, names in loaded.items() if names}


def test_every_operator_command_runs_without_the_web_stack_and_the_broker_only_to_wake(
    tmp_path: Path,
) -> None:
    """`tasks show`, `plans show`, `actions approve` and `reject`, `tasks node`, `invocations
    resolve` and `outbox retry` and `discard` imported FastAPI and Starlette for the API's
    models (0.5 s each); `tasks cancel`, the decisions, the step and the resolution built the
    Celery dispatcher (Celery, Kombu, redis-py: 0.3 s) whether or not they sent a wake-up. Now
    the dispatcher is made at the first wake-up: the commands before the first one that queues
    a generation import no broker, and the ones that queue one still send its wake-up."""
    from orchestrator.store.db import Database
    from tests.cli_in_process import embedded_store
    from tests.executions_support import runtime_for
    from tests.integration.test_approvals import waiting_task
    from tests.integration.test_human_steps import waiting_on_a_sample

    home = tmp_path / "home"
    store = embedded_store(home)
    rt, _ = runtime_for(store, tmp_path / "scripts")
    try:
        cancelled = rt.tasks.trigger(Trigger(task_type="demo", title="t")).task.task_id
        to_approve, approved = waiting_task(rt, tmp_path / "scripts")
        digest = rt.actions.get(approved).digest
        _, rejected = waiting_task(rt, tmp_path / "scripts")
        sampled = waiting_on_a_sample(rt, tmp_path / "scripts")
        session = rt.tasks.get(to_approve).session_id
    finally:
        rt.close()
    assert session is not None
    quiet = [  # none of these queues a generation
        ["tasks", "cancel", cancelled, "--by", "ana"],
        ["tasks", "show", to_approve],
        ["plans", "show", session],
        ["invocations", "resolve", "no-such-call", "--as", "failed", "--reason", "r"],
        ["outbox", "retry", "4242", "--by", "ana"],
        ["outbox", "discard", "4242", "--reason", "settled by hand", "--by", "ana"],
    ]
    waking = [  # each queues the next generation of its task
        ["actions", "reject", rejected, "--by", "ana", "--json"],
        ["tasks", "node", sampled, "sample", "--complete", "--evidence", "done", "--json"],
        ["actions", "approve", approved, "--digest", digest, "--by", "ana", "--json"],
    ]
    steps = dict(zip(map(" ".join, quiet + waking), _steps(quiet + waking, home), strict=True))
    said = [(s["code"], s["out"].splitlines()[:1], s["err"]) for s in steps.values()]
    assert [code for code, _, _ in said] == [0, 0, 0, 1, 1, 1, 0, 0, 0], said
    assert "Traceback" not in "".join(err for _, _, err in said)
    shown, plan, resolved, retried, discarded, rejection, step, approval = list(steps.values())[1:]
    assert shown["out"].startswith(f"task {to_approve}  ")
    assert f"(session {session}, revision 2)" in plan["out"]
    assert "not_found" in resolved["err"]
    assert "not_found" in retried["err"]
    assert "not_found" in discarded["err"]
    # Each queued a generation, and its wake-up went to the broker.
    for waked in (rejection, step, approval):
        assert json.loads(waked["out"])["dispatched"] is True, waked
    db = Database.from_url(store)
    try:
        from orchestrator.services.dispatch import RecordingDispatcher
        from orchestrator.services.tasks import TaskService

        tasks = TaskService(db, RecordingDispatcher())
        assert tasks.get(cancelled).status == "cancelled"
        assert [tasks.get(t).generation for t in (sampled, to_approve)] == [2, 2]
        assert tasks.get(to_approve).status == "queued"
    finally:
        db.dispose()
    last_quiet = list(steps.values())[len(quiet) - 1]
    assert (_any_of(last_quiet, BROKER), _any_of(approval, WEB[:3])) == ({}, {})


#: The services a runtime builds when asked for them: each command imports its own.
SERVICES = (
    "orchestrator.services.sweeper",
    "orchestrator.services.actions",
    "orchestrator.services.human_steps",
    "orchestrator.services.plans",
    "orchestrator.services.tasks",
)


def test_a_command_imports_the_services_it_runs_and_no_other(tmp_path: Path) -> None:
    """The runtime imported every service it can build (the sweeper, the actions, the human
    steps, the plans, the tasks) for a command that uses one of them; `outbox list` imported
    httpx (0.1 s) for the dispatcher beside the listing; and each imported psycopg (0.13 s with
    SQLAlchemy's dialect for it), which an embedded store (SQLite) never calls; `tasks list`
    imported what only a task's explain view reads. The commands run in turn in one
    interpreter: each is checked for what it and the ones before imported."""
    from tests.cli_in_process import embedded_store

    home = tmp_path / "home"
    embedded_store(home)
    listed, actions, outbox = _steps(
        [["tasks", "list"], ["actions", "list"], ["outbox", "list"]], home
    )
    said = [(step["code"], step["out"], step["err"]) for step in (listed, actions, outbox)]
    assert said == [(0, "no tasks\n", ""), (0, "no actions\n", ""), (0, "no deliveries\n", "")]
    assert _any_of(listed, (*SERVICES[:4], "psycopg", *EXPLAIN_ONLY, *RECEIPTS_ONLY)) == {}
    assert _any_of(actions, (SERVICES[0], SERVICES[2], "psycopg")) == {}
    assert _any_of(outbox, (SERVICES[0], SERVICES[2], "psycopg", "httpx")) == {}


def test_a_trigger_sends_its_wake_up_to_the_file_broker_without_redis_or_httpx(
    tmp_path: Path,
) -> None:
    """An embedded trigger imported redis-py with the Redis transport's module (0.1 s), httpx
    with the log masking its wake-up's line would use (0.1 s), psycopg, and what only a task's
    explain view reads: a file broker and a SQLite store need none of them, a trigger none of
    that view. The wake-up still goes out."""
    from tests.cli_in_process import embedded_store

    home = tmp_path / "home"
    embedded_store(home)
    found = _imported(["tasks", "trigger", "--type", "demo", "--title", "t", "--json"], home)
    assert found["code"] == 0, found["err"]
    assert json.loads(str(found["out"]))["dispatched"] is True
    unused = (*EXPLAIN_ONLY, *RECEIPTS_ONLY, *CLEANUP_ONLY)
    assert _any_of(found, ("redis", "httpx", "psycopg", *unused)) == {}
    assert _any_of(found, ("celery",)) != {}


def test_a_worker_start_reads_the_migration_scripts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's start checks the store's revision against this code's (`check_store_ready`):
    it read the migration scripts, which runs every one of them, twice (the head, then whether
    the store's revision is known), and `db upgrade` twice before Alembic's own reading."""
    from alembic.script import ScriptDirectory

    from orchestrator.cli.db import check_store_ready, refuse_newer_store
    from orchestrator.store import migrations
    from tests.cli_in_process import embedded_store

    store = embedded_store(tmp_path / "home")
    read: list[object] = []

    class Counted:
        @staticmethod
        def from_config(config: object) -> ScriptDirectory:
            read.append(config)
            return ScriptDirectory.from_config(config)  # type: ignore[arg-type]

    monkeypatch.setattr(migrations, "ScriptDirectory", Counted)
    migrations._scripts.cache_clear()  # read by an earlier test of this process
    check_store_ready(store)
    refuse_newer_store(store)
    assert len(read) == 1
