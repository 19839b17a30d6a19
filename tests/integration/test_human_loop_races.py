"""Careless and hostile people and clients of the human loop (DESIGN invariants 22 and 24).

A decision's and a step's texts are checked alike on every path (API, CLI), a refusal writes
nothing, and an approval reaches the business backend once.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.services.tasks import Trigger
from orchestrator.settings import SettingsError, load_settings
from orchestrator.store import outbox_views
from orchestrator.store import plans as plan_store
from orchestrator.store import task_events as event_store
from tests.executions_support import node, plan_call, report_call, write_script
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task


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
        webhook_secret="webhook-secret-for-races",
        actions_secret="actions-secret-for-races",
    ) as runtime:
        yield runtime


@pytest.fixture
def client(rt: Runtime, store_url: str) -> Iterator[TestClient]:
    """The API on the test's store (the loopback API without tokens: `by` comes from the body)."""
    app = create_app(load_settings(database_url=store_url))
    app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
    app.state.human_steps = HumanStepService(rt.db, app.state.plans, RecordingDispatcher())
    with TestClient(app) as test_client:
        yield test_client


#: Texts that show nothing: zero-width spaces, bidi controls, a byte-order mark, a control.
INVISIBLE = ["\u200b", "\u202e\u200b", "\ufeff \u2060", "\x01"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_an_invisible_evidence_reason_or_name_is_refused_as_blank_and_writes_nothing(
    rt: Runtime, tmp_path: Path, client: TestClient, text: str
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    with rt.db.transaction(readonly=True) as conn:
        before = plan_store.latest_revision(conn, rt.tasks.get(task_id).session_id or "")
    assert before is not None
    step = f"/api/v1/tasks/{task_id}/nodes/repair"
    refusals = [
        (f"{step}/complete", {"by": "ana", "evidence": text}, "body.evidence"),
        (f"{step}/fail", {"by": "ana", "reason": text}, "body.reason"),
        (f"{step}/skip", {"by": text, "reason": "no longer needed"}, "body.by"),
        (f"/api/v1/actions/{action_id}/approve", {"by": text, "digest": digest}, "body.by"),
        (f"/api/v1/actions/{action_id}/reject", {"by": text}, "body.by"),
    ]
    for path, body, field in refusals:
        answer = client.post(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        (detail,) = answer.json()["error"]["details"]
        # Said as the rule, not as pydantic's kind of error ("Value error, ...").
        assert (detail["field"], detail["message"]) == (field, "must not be blank")
    assert rt.actions.get(action_id).status == "pending_approval"
    with rt.db.transaction(readonly=True) as conn:
        after = plan_store.latest_revision(conn, before.session_id)
    assert after is not None
    assert after.revision == before.revision


@pytest.fixture
def cli_env(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))


def test_a_name_or_note_over_its_limit_is_refused_as_too_long_in_characters(
    rt: Runtime, tmp_path: Path, client: TestClient
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    step = f"/api/v1/tasks/{task_id}/nodes/repair"
    refusals = [
        (f"{step}/skip", {"by": "n" * 129, "reason": "no longer needed"}, "body.by", 128),
        (f"/api/v1/actions/{action_id}/reject", {"by": "n" * 129}, "body.by", 128),
        (
            f"/api/v1/actions/{action_id}/reject",
            {"by": "ana", "note": "x" * 2001},
            "body.note",
            2000,
        ),
    ]
    for path, body, field, limit in refusals:
        answer = client.post(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        (detail,) = answer.json()["error"]["details"]
        said = f"String should have at most {limit} characters"
        assert (detail["field"], detail["message"]) == (field, said)
    assert rt.actions.get(action_id).status == "pending_approval"


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--by", "", "--by"),  # an unset $APPROVER: not the OS user's approval
        ("--by", "   ", "--by"),
        ("--by", "\u200b\u202e", "--by"),  # invisible: reads as nobody, or as someone else
        # In characters, as the API's 422 says (not pydantic's "at most 128 items after
        # validation", which the optional texts read).
        ("--by", "n" * 129, "--by: String should have at most 128 characters\n"),
        ("--note", "x" * 2001, "--note: String should have at most 2000 characters\n"),
    ],
)
def test_the_cli_refuses_a_decision_text_the_api_refuses_and_decides_nothing(
    rt: Runtime,
    tmp_path: Path,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: str,
    said: str,
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    for verb in ("approve", "reject"):
        argv = ["actions", verb, action_id, "--digest", digest, "--by", "ana", flag, value]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"invalid {said}" in err
        assert "Traceback" not in err
    assert rt.actions.get(action_id).status == "pending_approval"
    assert rt.tasks.get(task_id).status == "waiting"
    with rt.db.transaction(readonly=True) as conn:
        assert outbox_views.list_rows(conn, task_id=task_id, kind="action") == []


def test_the_cli_refuses_an_empty_by_on_a_human_step(
    rt: Runtime, tmp_path: Path, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    argv = ["tasks", "node", task_id, "repair", "--complete", "--evidence", "done", "--by", ""]
    assert main(argv) == 2
    # Empty: the limits come before the blank check (the rule a required text's `--reason`
    # follows), so it is said as a length; blanks only are "must not be blank".
    assert capsys.readouterr().err == (
        "orchestrator: invalid --by: String should have at least 1 character\n"
    )
    assert main([*argv[:-1], "  "]) == 2
    assert capsys.readouterr().err == "orchestrator: invalid --by: must not be blank\n"


def test_actions_show_escapes_a_stored_note_that_would_drive_the_terminal(
    rt: Runtime, tmp_path: Path, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _, action_id = waiting_task(rt, tmp_path)
    # Stored by an older version, or straight into the store: the CLI never prints it raw.
    note = "\x1b[2J\x1b[31mall clear\u202e"
    rt.actions.decide(action_id, approve=False, by="ana\x1b[8m", note=note)
    assert main(["actions", "show", action_id]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert "decided by ana\\x1b[8m" in out


def failed_node_task(rt: Runtime, tmp_path: Path) -> tuple[str, str]:
    """A task whose agent proposed a work order for `repair`, then marked `repair` failed with
    the order still pending, and waits: (task, action)."""
    proposal = {
        "id": "c2",
        "name": "propose_action",
        "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "north"}},
    }
    failed = node("repair", "failed") | {"action_id": "${c2.result.action_id}"}
    write_script(
        tmp_path / "scripts",
        "gave_up",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {"tool_calls": [proposal]},
            {"tool_calls": [plan_call("c3", "r2", [failed])]},
            {"tool_calls": [report_call("c4", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="gave_up", title="Burst main")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"  # on the action
    (action,) = rt.actions.list(task_id=task_id)
    return task_id, action.action_id


def test_an_action_whose_node_the_agent_failed_is_not_approved_or_delivered_but_is_rejected(
    rt: Runtime, tmp_path: Path, client: TestClient
) -> None:
    task_id, action_id = failed_node_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    refused = client.post(
        f"/api/v1/actions/{action_id}/approve", json={"by": "ana", "digest": digest}
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "stale_approval")
    assert "failed" in refused.json()["error"]["message"]
    assert rt.actions.get(action_id).status == "pending_approval"
    with rt.db.transaction(readonly=True) as conn:
        assert outbox_views.list_rows(conn, task_id=task_id, kind="action") == []
    # A rejection still lets the task, which waits on every pending action, move on.
    rejected = client.post(f"/api/v1/actions/{action_id}/reject", json={"by": "ana"})
    assert (rejected.status_code, rejected.json()["status"]) == (200, "rejected")
    assert rt.tasks.get(task_id).status == "queued"


def test_the_cli_refuses_an_empty_by_on_a_write_resolution(
    rt: Runtime, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["invocations", "resolve", "nope", "--as", "failed", "--reason", "no", "--by", ""]
    assert main(argv) == 2  # checked before the store is asked about the invocation
    assert "invalid --by" in capsys.readouterr().err


class _Trickling(BaseHTTPRequestHandler):
    """A backend under load: it answers 200, but its header lines come a byte at a time, each
    byte well within the dispatcher's read timeout, the whole answer well past its hold."""

    protocol_version = "HTTP/1.1"
    keys: list[str]
    arrived: threading.Event
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            self.keys.append(self.headers.get("Idempotency-Key", ""))
        self.arrived.set()
        with contextlib.suppress(OSError):  # the dispatcher may hang up meanwhile
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow")
            self.wfile.flush()
            for _ in range(10):  # 3 s in all; the dispatcher's timeout is 1 s, its hold 2 s
                time.sleep(0.3)
                self.wfile.write(b"w")
                self.wfile.flush()
            self.wfile.write(b": 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def trickling() -> Iterator[tuple[str, list[str], threading.Event]]:
    keys: list[str] = []
    arrived = threading.Event()
    handler = type("Handler", (_Trickling,), {"keys": keys, "arrived": arrived})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/actions", keys, arrived
    finally:
        server.shutdown()
        server.server_close()


def slow_backend_dispatchers(
    rt: Runtime, tmp_path: Path, url: str, count: int
) -> tuple[str, list[OutboxDispatcher]]:
    """An approved action, and `count` dispatchers of actions to `url` with a 1 s timeout."""
    _, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(
        action_id, approve=True, by="ana", note=None, digest=rt.actions.get(action_id).digest
    )
    only_actions = {"actions_url": url, "webhook_url": None, "outbox_timeout_seconds": 1.0}
    settings = rt.settings.model_copy(update=only_actions)
    return action_id, [OutboxDispatcher(settings, rt.db) for _ in range(count)]


def test_an_approval_a_slow_backend_is_still_answering_is_not_sent_again_by_another_dispatcher(
    rt: Runtime, tmp_path: Path, trickling: tuple[str, list[str], threading.Event]
) -> None:
    url, keys, _ = trickling
    action_id, (first, second) = slow_backend_dispatchers(rt, tmp_path, url, 2)
    assert first.hold_seconds == 2.0
    sending = threading.Thread(target=first.run_once)
    sending.start()
    try:
        # The second dispatcher polls all the while the first one's send lasts (3 s, past
        # the 2 s hold): the row is the first one's until its answer is in.
        idle = threading.Event()
        while sending.is_alive():
            second.run_once()
            idle.wait(0.05)
    finally:
        sending.join(timeout=30)
        first.close()
        second.close()
    assert keys == [action_id]  # sent once, though the send outlasted its hold
    (row,) = OutboxService(rt.db).list(kind="action")
    assert (row.status, row.attempts) == ("delivered", 1)


def test_a_dispatcher_closed_mid_send_returns_at_once_and_renews_the_hold_no_more(
    rt: Runtime, tmp_path: Path, trickling: tuple[str, list[str], threading.Event]
) -> None:
    # A stopping sweeper waits for its dispatcher's thread only so long, then closes it: the
    # send still trickling in that thread must not hold the close (or the process's exit).
    url, _, arrived = trickling
    _, (dispatcher,) = slow_backend_dispatchers(rt, tmp_path, url, 1)
    sending = threading.Thread(target=dispatcher.run_once, daemon=True)
    sending.start()
    assert arrived.wait(10)
    started = time.monotonic()
    dispatcher.close()
    assert time.monotonic() - started < 1.0
    sending.join(timeout=10)


def test_a_send_whose_headers_trickle_past_its_deadline_is_given_up_and_left_for_later(
    rt: Runtime, tmp_path: Path, trickling: tuple[str, list[str], threading.Event]
) -> None:
    # The hold is renewed while a send lasts; without an end to that, a backend that trickles
    # its headers for ever held the row (and its dispatcher) for good.
    url, keys, _ = trickling
    action_id, (dispatcher,) = slow_backend_dispatchers(rt, tmp_path, url, 1)
    dispatcher.send_deadline = 1.2  # the trickle takes 3 s
    started = time.monotonic()
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
    assert time.monotonic() - started < 2.8
    assert keys == [action_id]
    assert report.delivered == []
    (row,) = OutboxService(rt.db).list(kind="action")
    assert (row.status, row.attempts, row.delivered_at) == ("pending", 1, None)
    assert row.last_error is not None
    assert "no answer within 1.2 s" in row.last_error


def test_a_console_write_without_its_header_is_refused_saying_what_is_missing(
    rt: Runtime, tmp_path: Path, store_url: str
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    accounts = tmp_path / "operators"
    accounts.write_text(f"alma approver {hashlib.sha256(b'alma-token').hexdigest()}\n")
    app = create_app(load_settings(database_url=store_url, operators=accounts))
    app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
    with TestClient(app) as browser:
        signed_in = browser.post(
            "/console/session", data={"token": "alma-token"}, follow_redirects=False
        )
        assert signed_in.status_code == 303
        approve = f"/api/v1/actions/{action_id}/approve"
        bare = browser.post(approve, json={"digest": digest})  # a script without the header
        assert (bare.status_code, bare.json()["error"]["code"]) == (401, "unauthorized")
        assert "X-Orch-Console: 1" in bare.json()["error"]["message"]
        cancel = browser.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "stop"})
        assert "X-Orch-Console: 1" in cancel.json()["error"]["message"]
        assert rt.actions.get(action_id).status == "pending_approval"
        assert rt.tasks.get(task_id).status == "waiting"
        # Without a valid session, the refusal stays the token's: nothing about a console.
        browser.cookies.clear()
        browser.cookies.set("orch_console", "v2.YWxtYQ.9999999999.nonce.forged")
        forged = browser.post(approve, json={"digest": digest}, headers={"X-Orch-Console": "1"})
        assert forged.json()["error"]["message"] == "missing or wrong bearer token"
        approved = browser.post(approve, json={"digest": digest})
        assert approved.status_code == 401
    assert rt.actions.get(action_id).status == "pending_approval"


def at_once(
    calls: list[tuple[str, dict[str, object]]], client: TestClient
) -> list[tuple[int, str]]:
    """POST each (path, body) on its own thread, released together by one barrier: each
    answer's status and its error code (or "ok")."""
    barrier = threading.Barrier(len(calls))
    answers: list[tuple[int, str]] = [(0, "")] * len(calls)

    def post(index: int, path: str, body: dict[str, object]) -> None:
        barrier.wait(timeout=10)
        answer = client.post(path, json=body)
        code = answer.json()["error"]["code"] if answer.status_code >= 400 else "ok"
        answers[index] = (answer.status_code, code)

    threads = [
        threading.Thread(target=post, args=(index, path, body))
        for index, (path, body) in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


@pytest.mark.parametrize("round_number", range(3))
def test_two_approvers_and_an_operator_at_once_decide_once_and_deliver_at_most_the_approval(
    rt: Runtime, tmp_path: Path, client: TestClient, round_number: int
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    decide = f"/api/v1/actions/{action_id}"
    answers = at_once(
        [
            (f"{decide}/approve", {"by": "alma", "digest": digest}),
            (f"{decide}/approve", {"by": "alma", "digest": digest}),  # a double click
            (f"{decide}/reject", {"by": "bob", "note": "wrong valve"}),
            (f"/api/v1/tasks/{task_id}/cancel", {"reason": "duplicate complaint"}),
        ],
        client,
    )
    decisions = answers[:3]
    assert answers[3] == (200, "ok")  # a cancel is never refused for a decision
    # At most one decision took; every other is a 409 with its code, and wrote nothing.
    assert sum(code == "ok" for _, code in decisions) <= 1
    assert all(
        (status, code) == (200, "ok") or (status == 409 and code in _REFUSED)
        for status, code in decisions
    )
    action = rt.actions.get(action_id)
    took = [index for index, (_, code) in enumerate(decisions) if code == "ok"]
    expected = {(): "superseded", (0,): "approved", (1,): "approved", (2,): "rejected"}
    assert action.status == expected[tuple(took)]
    assert rt.tasks.get(task_id).status == "cancelled"
    with rt.db.transaction(readonly=True) as conn:
        rows = outbox_views.list_rows(conn, task_id=task_id, kind="action")
        types = [e.type for e in event_store.events_after(conn, task_id, 0, 100)]
    # The approval, and only an approval, is in the outbox once; the backend hears of the
    # cancel after the decision it followed, or of the superseded proposal.
    assert [row.action_id for row in rows] == ([action_id] if action.status == "approved" else [])
    assert types.count("action_decided") == (0 if action.status == "superseded" else 1)
    if action.status == "approved":
        assert types.index("action_task_cancelled") < types.index("cancelled")
    if action.status == "superseded":
        assert types.index("action_superseded") < types.index("cancelled")


_REFUSED = frozenset({"already_decided", "stale_approval"})


def sample_task(rt: Runtime, tmp_path: Path) -> str:
    """A task that waits on one human node, `sample`, and nothing else."""
    sample = node("sample", "waiting", actor="human")
    write_script(
        tmp_path / "scripts",
        "sampling",
        [
            {"tool_calls": [plan_call("c1", "r1", [sample])]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="sampling", title="Turbid")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    return task_id


@pytest.mark.parametrize("round_number", range(3))
def test_two_people_closing_one_step_at_once_with_a_cancel_write_one_close_or_none(
    rt: Runtime, tmp_path: Path, client: TestClient, round_number: int
) -> None:
    task_id = sample_task(rt, tmp_path)
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    step = f"/api/v1/tasks/{task_id}/nodes/sample"
    answers = at_once(
        [
            (f"{step}/complete", {"by": "lab", "evidence": "0.3 NTU"}),
            (f"{step}/complete", {"by": "crew", "evidence": "4.8 NTU"}),  # other evidence
            (f"{step}/fail", {"by": "crew", "reason": "the bottle broke"}),
            (f"/api/v1/tasks/{task_id}/cancel", {"reason": "duplicate complaint"}),
        ],
        client,
    )
    steps = answers[:3]
    assert answers[3] == (200, "ok")
    assert all(
        (status, code) == (200, "ok")
        or (status == 409 and code in {"node_closed", "task_finished"})
        for status, code in steps
    )
    took = [index for index, (_, code) in enumerate(steps) if code == "ok"]
    assert len(took) <= 1
    with rt.db.transaction(readonly=True) as conn:
        plan = plan_store.latest_revision(conn, session_id)
    assert plan is not None
    (sample,) = plan.nodes
    # One person's close is the plan's, with that person's evidence, in one revision; or none.
    assert plan.revision == 1 + len(took)  # the agent's plan, then one close or none
    wanted = {(): "waiting", (0,): "completed", (1,): "completed", (2,): "failed"}
    assert sample["status"] == wanted[tuple(took)]
    if took in ([0], [1]):
        assert sample["evidence"] == ["0.3 NTU", "4.8 NTU"][took[0]]
    assert rt.tasks.get(task_id).status == "cancelled"


def _account_line(name: str, role: str) -> str:
    return f"{name} {role} {hashlib.sha256(f'{name}-token'.encode()).hexdigest()}\n"


def accounts_app(rt: Runtime, store_url: str, accounts: Path) -> TestClient:
    app = create_app(load_settings(database_url=store_url, operators=accounts))
    app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
    app.state.human_steps = HumanStepService(rt.db, app.state.plans, RecordingDispatcher())
    return TestClient(app)


def test_an_operators_file_that_names_no_account_stops_start_up_instead_of_opening_the_api(
    rt: Runtime, tmp_path: Path, store_url: str
) -> None:
    # Without accounts and ORCH_API_TOKEN the API is the loopback one, open to anyone as an
    # approver; `orchestrator api` lets a set ORCH_OPERATORS listen on the network.
    accounts = tmp_path / "operators"
    accounts.write_text("# name role sha256 (to be filled in)\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"ORCH_OPERATORS.*names no account"):
        create_app(load_settings(database_url=store_url, operators=accounts))


def test_an_account_removed_or_demoted_in_the_operators_file_loses_its_rights_at_once(
    rt: Runtime, tmp_path: Path, store_url: str
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    accounts = tmp_path / "operators"
    accounts.write_text(_account_line("alma", "approver") + _account_line("bob", "approver"))
    approve = f"/api/v1/actions/{action_id}/approve"
    with accounts_app(rt, store_url, accounts) as client:
        assert client.get(approve[: -len("/approve")], headers=bearer("bob")).status_code == 200
        # Bob's token leaked: he is taken out, alma becomes a viewer; no restart.
        accounts.write_text(_account_line("alma", "viewer") + "# bob removed\n")
        gone = client.post(approve, json={"digest": digest}, headers=bearer("bob"))
        assert (gone.status_code, gone.json()["error"]["code"]) == (401, "unauthorized")
        demoted = client.post(approve, json={"digest": digest}, headers=bearer("alma"))
        assert (demoted.status_code, demoted.json()["error"]["code"]) == (403, "forbidden")
        assert rt.actions.get(action_id).status == "pending_approval"
        # A file that no longer reads refuses everyone, saying why (never the hashes), until
        # it is mended: not the open API of no accounts, nor the accounts it had before.
        accounts.write_text(_account_line("alma", "approver") + "bob approver\n")
        broken = client.get(f"/api/v1/tasks/{task_id}", headers=bearer("alma"))
        assert (broken.status_code, broken.json()["error"]["code"]) == (
            503,
            "operators_unreadable",
        )
        assert "ORCH_OPERATORS line 2" in broken.json()["error"]["message"]
        assert str(tmp_path) not in broken.text  # nor where the file lives
        assert hashlib.sha256(b"alma-token").hexdigest() not in broken.text
        # An account listed twice: the line and the kind of problem, not the account's name.
        accounts.write_text(_account_line("alma", "approver") + _account_line("alma", "viewer"))
        twice = client.get(f"/api/v1/tasks/{task_id}")
        assert (twice.status_code, twice.json()["error"]["code"]) == (503, "operators_unreadable")
        assert "ORCH_OPERATORS line 2: an account name appears twice" in twice.text
        assert "alma" not in twice.text
        accounts.write_text("")  # emptied: still no open API
        refused = client.post(approve, json={"digest": digest, "by": "anyone"})
        assert refused.status_code == 503
        assert rt.actions.get(action_id).status == "pending_approval"
        accounts.write_text(_account_line("alma", "approver"))
        approved = client.post(approve, json={"digest": digest}, headers=bearer("alma"))
        assert (approved.status_code, approved.json()["decided_by"]) == (200, "alma")


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {name}-token"}


def test_an_action_on_a_human_node_a_person_completed_is_not_approved_but_is_rejected(
    rt: Runtime, tmp_path: Path, client: TestClient
) -> None:
    """A person did the step (the call-back, say) while its work order waited: approving the
    order now would send the work a second time, so the approval is stale; a rejection lets
    the task move on."""
    proposal = {
        "id": "c2",
        "name": "propose_action",
        "arguments": {"node_id": "callback", "kind": "work_order", "payload": {"crew": "west"}},
    }
    write_script(
        tmp_path / "scripts",
        "human_order",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("callback", "waiting", actor="human")])]},
            {"tool_calls": [proposal]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="human_order", title="Call back")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    (action,) = rt.actions.list(task_id=task_id)
    done = client.post(
        f"/api/v1/tasks/{task_id}/nodes/callback/complete",
        json={"by": "maria", "evidence": "called the customer at 10:05"},
    )
    assert done.status_code == 200, done.text
    refused = client.post(
        f"/api/v1/actions/{action.action_id}/approve", json={"by": "ana", "digest": action.digest}
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "stale_approval")
    assert "completed" in refused.json()["error"]["message"]
    assert rt.actions.get(action.action_id).status == "pending_approval"
    with rt.db.transaction(readonly=True) as conn:
        assert outbox_views.list_rows(conn, task_id=task_id, kind="action") == []
    rejected = client.post(f"/api/v1/actions/{action.action_id}/reject", json={"by": "ana"})
    assert (rejected.status_code, rejected.json()["status"]) == (200, "rejected")
