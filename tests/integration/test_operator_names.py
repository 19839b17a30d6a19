"""Who did a thing (`by`) has one limit, `NAME_MAX` characters, on every command that takes it:
a requeue, a cancel, a decision, a person's step, a write's resolution, a delivery's retry or
discard; over the API and the CLI alike. A name of the limit is recorded; one character more is
refused in the same words by each, and writes nothing.

Before, a requeue, a cancel and the outbox's retry and discard took 200 characters where a
decision, a step and a resolution took 128: an operator named in 150 could requeue a task but
not approve its action.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.operators import OperatorsError, load_operators
from orchestrator.runtime import Runtime
from orchestrator.services.invocations import InvocationService
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store.tables import task_events
from tests.executions_support import node, plan_call, report_call, write_script
from tests.integration.receipt_rows import (
    claim_arguments,
    dump_database,
    running_task,
    supersede,
)
from tests.outbox_support import Recorder, outbox_runtime, running_recorder

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

#: The limit (`orchestrator.domain.storable.NAME_MAX`), said here as the test expects it.
NAME_MAX = 128
NAME = "n" * NAME_MAX
TOO_LONG = "n" * (NAME_MAX + 1)
SAID = f"String should have at most {NAME_MAX} characters"


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url,
        tmp_path,
        backend,
        webhook_secret="webhook-secret-for-names",
        actions_secret="actions-secret-for-names",
    ) as runtime:
        yield runtime


@dataclass(frozen=True)
class Scene:
    """A task waiting on two work orders and two people's steps, whose first webhook is a dead
    letter, and another task's `unknown` write."""

    task_id: str
    approved: str
    digest: str
    rejected: str
    dead_id: int
    invocation_id: str


def scene(rt: Runtime, tmp_path: Path, backend: Recorder) -> Scene:
    def propose(call_id: str, node_id: str) -> dict[str, Any]:
        arguments = {"node_id": node_id, "kind": "work_order", "payload": {"crew": node_id}}
        return {"id": call_id, "name": "propose_action", "arguments": arguments}

    nodes = [
        node("repair", "waiting"),
        node("flush", "waiting"),
        node("sample", "waiting", actor="human"),
        node("callback", "pending", actor="human"),
    ]
    write_script(
        tmp_path / "scripts",
        "names",
        [
            {"tool_calls": [plan_call("c1", "r1", nodes)]},
            {"tool_calls": [propose("c2", "repair"), propose("c3", "flush")]},
            {"tool_calls": [report_call("c4", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="names", title="Burst main")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    approved, rejected = (a["action_id"] for a in rt.tasks.explain(task_id)["pending_actions"])
    backend.answers = [422]  # the first webhook is refused for good: a dead letter
    OutboxDispatcher(rt.settings, rt.db).run_once()
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    # A write of another task, lost with its generation: `unknown`, for a person to resolve.
    other, session_id, fence = running_task(rt.db)
    claim = rt.ledger.claim(**claim_arguments(session_id, owner=f"task:{other}"), fence=fence)
    rt.ledger.finish(
        claim.receipt.invocation_id, claim.receipt.claim_token, status="unknown", summary="s"
    )
    supersede(rt.db, fence)
    digest = rt.actions.get(approved).digest
    return Scene(task_id, approved, digest, rejected, dead.outbox_id, claim.receipt.invocation_id)


def api_commands(s: Scene, by: str) -> list[tuple[str, dict[str, Any]]]:
    """Every route that records who acted, in an order in which each one applies."""
    step = f"/api/v1/tasks/{s.task_id}/nodes"
    return [
        (f"/api/v1/actions/{s.approved}/approve", {"by": by, "digest": s.digest}),
        (f"/api/v1/actions/{s.rejected}/reject", {"by": by}),
        (f"{step}/sample/complete", {"by": by, "evidence": "chlorine 0.4 mg/L"}),
        (f"{step}/callback/fail", {"by": by, "reason": "no answer"}),
        (
            f"/api/v1/invocations/{s.invocation_id}/resolve",
            {"status": "failed", "reason": "no order", "by": by},
        ),
        (f"/api/v1/outbox/{s.dead_id}/retry", {"by": by}),
        (f"/api/v1/outbox/{s.dead_id}/discard", {"by": by, "reason": "sent by hand"}),
        (f"/api/v1/tasks/{s.task_id}/requeue", {"by": by, "reason": "fresh look"}),
        (f"/api/v1/tasks/{s.task_id}/cancel", {"by": by}),
    ]


def cli_commands(s: Scene, by: str) -> list[list[str]]:
    node = ["tasks", "node", s.task_id]
    return [
        ["actions", "approve", s.approved, "--digest", s.digest, "--by", by],
        ["actions", "reject", s.rejected, "--by", by],
        [*node, "sample", "--complete", "--evidence", "chlorine 0.4 mg/L", "--by", by],
        [*node, "callback", "--fail", "--reason", "no answer", "--by", by],
        ["invocations", "resolve", s.invocation_id, "--as", "failed", "--reason", "x", "--by", by],
        ["outbox", "retry", str(s.dead_id), "--by", by],
        ["outbox", "discard", str(s.dead_id), "--reason", "sent by hand", "--by", by],
        ["tasks", "requeue", s.task_id, "--reason", "fresh look", "--by", by],
        ["tasks", "cancel", s.task_id, "--by", by],
    ]


def assert_recorded(rt: Runtime, s: Scene) -> None:
    """The name of the limit, whole, wherever each command keeps who acted."""
    assert rt.actions.get(s.approved).decided_by == NAME
    assert rt.actions.get(s.rejected).decided_by == NAME
    row = OutboxService(rt.db).shown(s.dead_id)
    assert (row["status"], row["retried_by"], row["discarded_by"]) == ("discarded", NAME, NAME)
    with rt.db.transaction(readonly=True) as conn:
        reasons = [r or "" for r in conn.execute(select(task_events.c.reason)).scalars()]
    for said in (
        f"human node sample completed by {NAME}",
        f"human node callback failed by {NAME}",
        f"{NAME} resolved",
        f"requeued by {NAME}: fresh look",
        f"cancelled by {NAME}",
    ):
        assert any(reason.startswith(said) for reason in reasons), said


def test_the_api_takes_a_name_of_the_limit_everywhere_and_refuses_one_more_alike(
    rt: Runtime, tmp_path: Path, backend: Recorder, store_url: str
) -> None:
    s = scene(rt, tmp_path, backend)
    app = create_app(load_settings(database_url=store_url))
    app.state.tasks = rt.tasks
    app.state.actions = rt.actions
    app.state.human_steps = rt.human_steps
    app.state.invocations = InvocationService(rt.db, rt.dispatcher)
    with TestClient(app, raise_server_exceptions=False) as client:
        before = dump_database(rt.db)
        for path, body in api_commands(s, TOO_LONG):
            answer = client.post(path, json=body)
            assert answer.status_code == 422, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "invalid_request", path
            assert [(d["field"], d["message"]) for d in error["details"]] == [("body.by", SAID)], (
                path
            )
        assert dump_database(rt.db) == before  # nothing written
        for path, body in api_commands(s, NAME):
            answer = client.post(path, json=body)
            assert answer.status_code == 200, (path, answer.text)
    assert_recorded(rt, s)


@pytest.fixture
def cli_scene(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Scene:
    """The scene, with the CLI (`main`, in this process) pointed at its store."""
    s = scene(rt, tmp_path, backend)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    return s


def test_the_cli_takes_a_name_of_the_limit_everywhere_and_refuses_one_more_alike(
    rt: Runtime, cli_scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = cli_scene
    before = dump_database(rt.db)
    for argv in cli_commands(s, TOO_LONG):
        assert main(argv) == 2, argv
        said = capsys.readouterr()
        assert (said.out, said.err) == ("", f"orchestrator: invalid --by: {SAID}\n"), argv
    assert dump_database(rt.db) == before  # nothing written
    for argv in cli_commands(s, NAME):
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    capsys.readouterr()
    assert_recorded(rt, s)


def test_an_account_is_named_within_the_limit_and_acts_by_its_name(
    rt: Runtime, tmp_path: Path, backend: Recorder, store_url: str
) -> None:
    """An operator account's name is the `by` of what it does (the console's too, signed in
    as it): an account named in NAME_MAX characters decides and is recorded whole; a name
    one longer is refused when the operators file is read, never cut when it acts."""
    s = scene(rt, tmp_path, backend)
    token = "long-named-approver-token"
    path = tmp_path / "operators"
    digest = hashlib.sha256(token.encode()).hexdigest()
    path.write_text(f"{TOO_LONG} approver {digest}\n", encoding="utf-8")
    with pytest.raises(OperatorsError, match="line 1: invalid or reserved name"):
        load_operators(path)
    path.write_text(f"{NAME} approver {digest}\n", encoding="utf-8")
    app = create_app(load_settings(database_url=store_url, operators=path))
    app.state.actions = rt.actions
    with TestClient(app) as client:
        answer = client.post(
            f"/api/v1/actions/{s.approved}/approve",
            json={"digest": s.digest},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert (answer.status_code, answer.json()["decided_by"]) == (200, NAME)


def test_every_command_without_by_and_no_user_name_says_to_give_by(
    rt: Runtime,
    cli_scene: Scene,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A container under a user id its image does not list, with LOGNAME and USER unset: each
    command that records who did it, its `--by` left out, refuses with one line (the outbox's
    retry and discard raised getpass's KeyError)."""
    s = cli_scene
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)

    def unlisted(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr("pwd.getpwuid", unlisted)
    before = dump_database(rt.db)
    for argv in cli_commands(s, NAME):
        without = argv[: argv.index("--by")]
        assert main(without) == 2, without
        said = capsys.readouterr()
        assert said.out == "", without
        assert said.err.startswith("orchestrator: give --by: your user name cannot be read"), (
            without,
            said.err,
        )
    assert dump_database(rt.db) == before  # nothing written
