"""Operator accounts (ORCH_OPERATORS): roles decide who reads, writes and approves, and a
decision's `by` is the authenticated name."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.operators import OperatorsError, load_operators
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.tasks import Trigger
from orchestrator.settings import SettingsError, load_settings
from orchestrator.store.task_events import events_of_type
from tests.executions_support import node, plan_call, report_call, runtime_for

TOKENS = {"vera": "viewer-token", "otto": "operator-token", "alma": "approver-token"}
ROLES = {"vera": "viewer", "otto": "operator", "alma": "approver"}


def operators_file(folder: Path) -> Path:
    path = folder / "operators"
    lines = ["# name role sha256(token)"] + [
        f"{name} {ROLES[name]} {hashlib.sha256(token.encode()).hexdigest()}"
        for name, token in TOKENS.items()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def setup(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, TestClient, str, str]]:
    scripts = tmp_path / "scripts"
    rt, _ = runtime_for(store_url, scripts)
    scripts.mkdir(parents=True, exist_ok=True)
    nodes = [node("repair", "waiting"), node("sample", "waiting", actor="human")]
    propose = {
        "id": "c2",
        "name": "propose_action",
        "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "n"}},
    }
    turns = [
        {"tool_calls": [plan_call("c1", "r1", nodes)]},
        {"tool_calls": [propose]},
        {"tool_calls": [report_call("c3", "waiting")]},
    ]
    (scripts / "op.json").write_text(json.dumps({"turns": turns}), encoding="utf-8")
    task_id = rt.tasks.trigger(Trigger(task_type="op", title="Pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    (action,) = rt.actions.list(task_id=task_id)
    settings = load_settings(
        database_url=store_url, operators=operators_file(tmp_path), api_token="shared-token"
    )
    app = create_app(settings)
    app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
    app.state.human_steps = HumanStepService(rt.db, rt.plans, RecordingDispatcher())
    with TestClient(app) as client:
        yield rt, client, task_id, action.action_id
    rt.close()


def test_roles_decide_what_an_account_may_do(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    rt, client, task_id, action_id = setup
    digest = rt.actions.get(action_id).digest
    approve = f"/api/v1/actions/{action_id}/approve"
    body = {"digest": digest, "by": "someone else", "note": "ok"}

    assert client.get(f"/api/v1/tasks/{task_id}").status_code == 401
    assert client.get(f"/api/v1/tasks/{task_id}", headers=bearer("nope")).status_code == 401
    assert client.get(f"/api/v1/tasks/{task_id}", headers=bearer(TOKENS["vera"])).status_code == 200
    for name in ("vera", "otto"):
        refused = client.post(approve, json=body, headers=bearer(TOKENS[name]))
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
        assert TOKENS[name] not in refused.text
    viewer_write = client.post(
        f"/api/v1/tasks/{task_id}/nodes/sample/complete",
        json={"evidence": "x"},
        headers=bearer(TOKENS["vera"]),
    )
    assert (viewer_write.status_code, viewer_write.json()["error"]["code"]) == (403, "forbidden")
    assert rt.actions.get(action_id).status == "pending_approval"

    step = client.post(
        f"/api/v1/tasks/{task_id}/nodes/sample/complete",
        json={"evidence": "0.4 mg/L", "by": "not me"},
        headers=bearer(TOKENS["otto"]),
    )
    assert (step.status_code, step.json()["by"]) == (200, "otto")

    approved = client.post(approve, json=body, headers=bearer(TOKENS["alma"]))
    assert approved.status_code == 200
    assert approved.json()["decided_by"] == "alma"  # the authenticated name, not the body's
    assert rt.tasks.get(task_id).status == "queued"


def test_the_shared_api_token_is_one_full_rights_account(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    rt, client, _, action_id = setup
    digest = rt.actions.get(action_id).digest
    approved = client.post(
        f"/api/v1/actions/{action_id}/approve",
        json={"digest": digest, "by": "night shift"},
        headers=bearer("shared-token"),
    )
    assert (approved.status_code, approved.json()["decided_by"]) == (200, "night shift")


def test_a_bad_operators_file_stops_start_up_in_one_line(store_url: str, tmp_path: Path) -> None:
    path = tmp_path / "operators"
    path.write_text("alma superuser " + "a" * 64 + "\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"ORCH_OPERATORS.*line 1: role must be one of"):
        create_app(load_settings(database_url=store_url, operators=path))
    for text, needle in [
        ("alma approver deadbeef\n", "64 hex digits"),
        ("api approver " + "a" * 64 + "\n", "reserved"),
        ("alma approver\n", "expected NAME ROLE"),
        # `printf %s "$TOKEN" | sha256sum` with $TOKEN unset: the empty token's hash.
        ("alma approver " + hashlib.sha256(b"").hexdigest() + "\n", "the empty token's"),
        ("alma approver " + hashlib.sha256(b"").hexdigest().upper() + "\n", "the empty token's"),
    ]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(OperatorsError, match=needle):
            load_operators(path)


def sign_in(client: TestClient, token: str) -> None:
    """Sign the client's browser session in with `token` (the client keeps the cookie)."""
    answer = client.post("/console/session", data={"token": token}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    assert token not in answer.headers["location"] + answer.headers["set-cookie"]


CONSOLE = {"X-Orch-Console": "1"}


def test_a_viewers_console_session_reads_and_every_write_is_403(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    rt, client, task_id, action_id = setup
    sign_in(client, TOKENS["vera"])
    state = client.get("/console/session").json()
    assert state["account"] == {"name": "vera", "role": "viewer", "shared": False}
    assert client.get(f"/api/v1/tasks/{task_id}").status_code == 200
    assert client.get("/api/v1/actions").status_code == 200
    digest = rt.actions.get(action_id).digest
    writes = [
        (f"/api/v1/actions/{action_id}/approve", {"digest": digest, "by": "vera"}),
        (f"/api/v1/tasks/{task_id}/nodes/sample/complete", {"evidence": "x"}),
        (f"/api/v1/tasks/{task_id}/requeue", {"reason": "again"}),
        (f"/api/v1/tasks/{task_id}/cancel", {"reason": "stop"}),
        ("/api/v1/tasks", {"task_type": "op", "title": "new"}),
    ]
    for path, body in writes:
        refused = client.post(path, json=body, headers=CONSOLE)
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden"), path
    assert rt.actions.get(action_id).status == "pending_approval"
    assert rt.tasks.get(task_id).status == "waiting"


def test_an_operators_console_session_writes_but_cannot_approve(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    rt, client, task_id, action_id = setup
    sign_in(client, TOKENS["otto"])
    digest = rt.actions.get(action_id).digest
    refused = client.post(
        f"/api/v1/actions/{action_id}/approve", json={"digest": digest}, headers=CONSOLE
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    step = client.post(
        f"/api/v1/tasks/{task_id}/nodes/sample/complete",
        json={"evidence": "0.4 mg/L", "by": "somebody"},
        headers=CONSOLE,
    )
    assert (step.status_code, step.json()["by"]) == (200, "otto")


def test_an_approvers_console_session_approves_as_itself(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    rt, client, _task_id, action_id = setup
    sign_in(client, TOKENS["alma"])
    digest = rt.actions.get(action_id).digest
    approve = f"/api/v1/actions/{action_id}/approve"
    body = {"digest": digest, "by": "night shift", "note": "go"}
    assert client.post(approve, json=body).status_code == 401  # no console header: refused
    approved = client.post(approve, json=body, headers=CONSOLE)
    assert approved.status_code == 200, approved.text
    assert approved.json()["decided_by"] == "alma"
    assert rt.actions.get(action_id).decided_by == "alma"


def test_a_console_session_ends_when_the_accounts_token_changes(
    setup: tuple[Runtime, TestClient, str, str], store_url: str, tmp_path: Path
) -> None:
    _, client, task_id, _ = setup
    sign_in(client, TOKENS["vera"])
    cookie = client.cookies.get("orch_console")
    assert cookie
    rotated = tmp_path / "rotated"
    rotated.write_text(f"vera viewer {hashlib.sha256(b'vera-new').hexdigest()}\n", encoding="utf-8")
    app = create_app(load_settings(database_url=store_url, operators=rotated))
    with TestClient(app) as other:
        other.cookies.set("orch_console", cookie)
        assert other.get(f"/api/v1/tasks/{task_id}").status_code == 401
        assert other.get("/console/session").json()["signed_in"] is False
    # The same file, a new process: the session is still good (nothing kept server-side).
    app = create_app(load_settings(database_url=store_url, operators=operators_file(tmp_path)))
    with TestClient(app) as again:
        again.cookies.set("orch_console", cookie)
        assert again.get(f"/api/v1/tasks/{task_id}").status_code == 200


def test_operator_accounts_alone_make_the_console_ask_to_sign_in(
    store_url: str, tmp_path: Path
) -> None:
    app = create_app(load_settings(database_url=store_url, operators=operators_file(tmp_path)))
    with TestClient(app) as client:
        assert 'id="signin-form"' in client.get("/console").text
        assert client.get("/console/session").json()["required"] is True
        wrong = client.get("/console?token=api-token-is-not-set")
        assert (wrong.status_code, "api-token-is-not-set" in str(wrong.url)) == (401, False)
        moved = client.get(f"/console?token={TOKENS['otto']}&x=1", follow_redirects=False)
        assert (moved.status_code, moved.headers["location"]) == (303, "/console?x=1")
        assert client.get("/console/session").json()["account"]["name"] == "otto"
        assert TOKENS["otto"] not in client.get("/console").text


def test_with_a_console_secret_a_cookie_signed_from_the_file_is_refused(
    setup: tuple[Runtime, TestClient, str, str], store_url: str, tmp_path: Path
) -> None:
    from orchestrator.api import console_session

    _, _, task_id, _ = setup
    secret = "s" * 24
    settings = load_settings(
        database_url=store_url, operators=operators_file(tmp_path), console_secret=secret
    )
    (alma,) = [a for a in load_operators(settings.operators) if a.operator.name == "alma"]
    with TestClient(create_app(settings)) as client:
        # Someone who read the operators file signs a cookie with its hash alone.
        client.cookies.set("orch_console", console_session.issue(alma))
        assert client.get(f"/api/v1/tasks/{task_id}").status_code == 401
        assert client.get("/console/session").json()["signed_in"] is False
        client.cookies.clear()
        sign_in(client, TOKENS["alma"])  # a real sign-in still works
        assert client.get("/console/session").json()["account"]["name"] == "alma"
        assert client.get(f"/api/v1/tasks/{task_id}").status_code == 200


def test_a_short_console_secret_stops_start_up(store_url: str) -> None:
    with pytest.raises(SettingsError, match=r"(?i)console_secret"):
        load_settings(database_url=store_url, console_secret="short")


def test_a_requeue_and_a_cancel_record_who_asked(
    setup: tuple[Runtime, TestClient, str, str],
) -> None:
    """An operator account's requeue and cancel name it, whatever the body's `by` says; the
    shared token names whom the body says, or no one."""
    rt, client, task_id, _action_id = setup
    requeued = client.post(
        f"/api/v1/tasks/{task_id}/requeue",
        json={"reason": "fresh look", "by": "somebody else"},
        headers=bearer(TOKENS["otto"]),
    )
    assert requeued.status_code == 200, requeued.text
    with rt.db.transaction(readonly=True) as conn:
        (queued,) = events_of_type(conn, task_id, "queued", 10)[-1:]
    assert (queued.reason, queued.data) == ("requeued by otto: fresh look", {"by": "otto"})

    cancelled = client.post(
        f"/api/v1/tasks/{task_id}/cancel",
        json={"reason": "wrong site", "by": "the night desk"},
        headers=bearer("shared-token"),
    )
    assert cancelled.status_code == 200, cancelled.text
    said = "cancelled by the night desk: wrong site"
    assert cancelled.json()["last_error"] == said
    task = rt.tasks.get(task_id)
    assert (task.status, task.last_error) == ("cancelled", said)

    other = rt.tasks.trigger(Trigger(task_type="op", title="Other")).task.task_id
    bare = client.post(f"/api/v1/tasks/{other}/cancel", headers=bearer("shared-token"))
    assert bare.json()["last_error"] == "cancelled by an operator"  # the token named no one
    named = rt.tasks.trigger(Trigger(task_type="op", title="Third")).task.task_id
    mine = client.post(f"/api/v1/tasks/{named}/cancel", headers=bearer(TOKENS["otto"]))
    assert mine.json()["last_error"] == "cancelled by otto"
