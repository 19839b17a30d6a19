"""Dead letters settled by an operator.

One dealt with by hand is discarded: it is never sent again, the task's later events go on,
`orchestrator_outbox_dead` drops, and the row keeps who, when and why until retention deletes
it (an approved action's row for good, saying its delivery was discarded). Before, a dead
letter could only be retried: one the backend refuses for good (a 422 for those bytes) held its
task's later events back for ever, and the gauge an alert reads never cleared.

After a backend refused every delivery (a secret rotated on one side only: 401 for all), the
operator mends it and makes every dead letter due again at once (the CLI's `--all-dead`, the
API's `retry-dead`), not one per row.

Both stores, a real HTTP backend on loopback, the API's routes and the CLI.
"""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.cleanup import run_cleanup
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store.tables import outbox
from orchestrator.store.task_events import events_of_type
from orchestrator.store.types import utcnow
from tests.integration.test_operator_accounts import bearer, operators_file
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task

DEAD_WEBHOOKS = "orchestrator_outbox_dead[('kind', 'webhook')]"
DEAD_ACTIONS = "orchestrator_outbox_dead[('kind', 'action')]"


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as runtime:
        yield runtime


@pytest.fixture
def dispatcher(rt: Runtime) -> Iterator[OutboxDispatcher]:
    sender = OutboxDispatcher(rt.settings, rt.db)
    yield sender
    sender.close()


@pytest.fixture
def client(rt: Runtime, tmp_path: Path) -> Iterator[TestClient]:
    """The API with operator accounts (vera viewer, otto operator) and the shared token."""
    settings = rt.settings.model_copy(
        update={"operators": operators_file(tmp_path), "api_token": "shared-token"}
    )
    with TestClient(create_app(settings, db=rt.db)) as api:
        yield api


def _gauges(rt: Runtime) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.metrics import render

    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(render(rt.db).decode())
        for s in family.samples
        if s.name == "orchestrator_outbox_dead"
    }


def _cli_on(monkeypatch: pytest.MonkeyPatch, store_url: str, tmp_path: Path) -> None:
    """The CLI, run in process by a test, on this store (its home in the test's folder)."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))


def _refused_event(rt: Runtime, tmp_path: Path, backend: Recorder, sender: OutboxDispatcher) -> int:
    """A waiting task whose first webhook the backend refused for good (422): its outbox id."""
    task_id, _ = waiting_task(rt, tmp_path)
    backend.answers = [422]
    sender.run_once()
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    assert dead.last_error == "HTTP 422 (a permanent refusal, not retried)"
    # The task's next event waits behind it, however often the dispatcher goes round.
    sender.run_once()
    assert [h.body["seq"] for h in backend.on("/hooks")] == [dead.event_seq]
    return dead.outbox_id


def test_a_discarded_dead_letter_lets_the_later_events_go_and_the_gauge_drop(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher, client: TestClient
) -> None:
    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    assert _gauges(rt)[DEAD_WEBHOOKS] == 1.0
    route = f"/api/v1/outbox/{dead_id}/discard"
    # A viewer reads only; the shared token must say who acts; a reason is required.
    refused = client.post(route, json={"reason": "x"}, headers=bearer("viewer-token"))
    assert refused.status_code == 403
    nobody = client.post(route, json={"reason": "x"}, headers=bearer("shared-token"))
    assert (nobody.status_code, nobody.json()["error"]["details"][0]["field"]) == (422, "by")
    blank = client.post(route, json={"reason": " ", "by": "a"}, headers=bearer("shared-token"))
    assert blank.status_code == 422
    # An operator account is recorded by its name, whatever the body says.
    done = client.post(
        route,
        json={"reason": "the crew reported it by phone", "by": "someone else"},
        headers=bearer("operator-token"),
    )
    assert done.status_code == 200, done.text
    view = done.json()
    assert (view["status"], view["discarded_by"]) == ("discarded", "otto")
    assert view["discard_reason"] == "the crew reported it by phone"
    assert view["discarded_at"] is not None
    assert view["delivered_at"] is None
    again = client.post(route, json={"reason": "x"}, headers=bearer("operator-token"))
    assert (again.status_code, again.json()["error"]["code"]) == (409, "invalid_transition")
    assert "only a dead or pending one can be discarded" in again.json()["error"]["message"]
    retried = client.post(f"/api/v1/outbox/{dead_id}/retry", headers=bearer("operator-token"))
    assert retried.status_code == 409
    missing = client.post(
        "/api/v1/outbox/999999/discard", json={"reason": "x"}, headers=bearer("operator-token")
    )
    assert missing.status_code == 404
    # Settled: the gauge drops, the later event goes, the discarded one is not sent again.
    assert _gauges(rt)[DEAD_WEBHOOKS] == 0.0
    dispatcher.run_once()
    seqs = [h.body["seq"] for h in backend.on("/hooks")]
    assert seqs == [seqs[0], seqs[0] + 1]
    listed = client.get(
        "/api/v1/outbox", params={"status": "discarded"}, headers=bearer("viewer-token")
    ).json()
    assert [(i["outbox_id"], i["discarded_by"]) for i in listed["items"]] == [(dead_id, "otto")]


def test_an_event_held_behind_a_dead_letter_says_so_where_the_task_is_shown(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It read 'never attempted' and due, like a stuck dispatcher: it names its dead letter."""
    from orchestrator.cli import main

    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    [dead] = OutboxService(rt.db).list(status="dead")
    view = client.get(f"/api/v1/tasks/{dead.task_id}", headers=bearer("viewer-token")).json()
    held = [x for x in view["deliveries"]["undelivered"] if x["status"] == "pending"]
    assert [x["waits_behind"] for x in held] == [dead_id]
    assert [x.get("waits_behind") for x in view["deliveries"]["undelivered"][:1]] == [None]
    _cli_on(monkeypatch, store_url, tmp_path)
    assert main(["tasks", "show", dead.task_id]) == 0
    out = capsys.readouterr().out
    assert f"waits behind dead letter outbox {dead_id} (outbox retry or discard it)" in out
    OutboxService(rt.db).discard(dead_id, reason="handled", by="ops")
    view = client.get(f"/api/v1/tasks/{dead.task_id}", headers=bearer("viewer-token")).json()
    assert all(x.get("waits_behind") is None for x in view["deliveries"]["undelivered"])


def test_the_outbox_list_names_the_dead_letter_a_pending_event_waits_behind(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`outbox list --status pending` and `GET /api/v1/outbox?status=pending` showed the held
    event due and never attempted, as a stuck dispatcher would leave it; `tasks show` named
    its dead letter, the list did not. A pending event of another task that is not held back
    says nothing."""
    from orchestrator.cli import main

    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    [dead] = OutboxService(rt.db).list(status="dead")
    free_task, _ = waiting_task(rt, tmp_path)  # its events are pending, behind nothing
    listed = client.get(
        "/api/v1/outbox", params={"status": "pending"}, headers=bearer("viewer-token")
    ).json()["items"]
    held = {i["outbox_id"]: i["waits_behind"] for i in listed if i["task_id"] == dead.task_id}
    assert held
    assert set(held.values()) == {dead_id}
    assert {i["waits_behind"] for i in listed if i["task_id"] == free_task} == {None}
    _cli_on(monkeypatch, store_url, tmp_path)
    assert main(["outbox", "list", "--status", "pending", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["outbox_id"]: r["waits_behind"] for r in rows if r["outbox_id"] in held} == held
    assert main(["outbox", "list", "--status", "pending", "--task", dead.task_id]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(held)
    assert all(
        line.endswith(f"waits behind dead letter outbox {dead_id} (outbox retry or discard it)")
        for line in lines
    )
    OutboxService(rt.db).discard(dead_id, reason="handled", by="ops")
    assert main(["outbox", "list", "--status", "pending", "--task", dead.task_id]) == 0
    assert "waits behind" not in capsys.readouterr().out


def test_a_dead_letter_has_no_next_attempt_where_it_is_listed(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dead row's `next_attempt_at` was the past time of its last backoff, which reads as
    "due now": it has none until an operator retries it (the stored column stays)."""
    from orchestrator.cli import main

    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    api = client.get("/api/v1/outbox", headers=bearer("viewer-token")).json()["items"]
    # The one held behind it is pending: it still has its time.
    assert {(i["status"], i["next_attempt_at"] is None) for i in api} == {
        ("dead", True),
        ("pending", False),
    }
    _cli_on(monkeypatch, store_url, tmp_path)
    assert main(["outbox", "list", "--status", "dead", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["outbox_id"], row["next_attempt_at"]) == (dead_id, None)
    task = client.get(f"/api/v1/tasks/{row['task_id']}", headers=bearer("viewer-token")).json()
    [shown] = [x for x in task["deliveries"]["undelivered"] if x["status"] == "dead"]
    assert shown["next_attempt_at"] is None
    retried = client.post(f"/api/v1/outbox/{dead_id}/retry", headers=bearer("operator-token"))
    assert retried.json()["next_attempt_at"] is not None  # due again: now
    # Its error is from before the retry: it read as the retry having failed.
    assert main(["outbox", "list", "--status", "pending", "--kind", "webhook"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(
        "last error, before the retry: HTTP 422 (a permanent refusal, not retried)"
    )
    dispatcher.run_once()  # delivered now, and so is the event held behind it
    api = client.get("/api/v1/outbox", headers=bearer("viewer-token")).json()["items"]
    assert {(i["status"], i["next_attempt_at"]) for i in api} == {("delivered", None)}


def test_a_discarded_webhook_stays_visible_until_retention_deletes_it(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    OutboxService(rt.db).discard(dead_id, reason="handled", by="ops")
    # The later event goes: the newest webhook sent, which retention keeps whatever its age
    # (the store's record that its webhooks are sent), is that one.
    dispatcher.run_once()
    run_cleanup(rt.db, rt.settings)
    row = OutboxService(rt.db).list(status="discarded")
    assert [r.outbox_id for r in row] == [dead_id]  # kept: discarded just now
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == dead_id)
            .values(discarded_at=utcnow() - timedelta(days=rt.settings.retention_days + 1))
        )
    report = run_cleanup(rt.db, rt.settings)
    assert report.webhooks_delivered_deleted >= 1
    assert OutboxService(rt.db).list(status="discarded") == []


def test_a_discarded_approval_is_never_sent_and_a_cancel_says_it_was_discarded(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="duty engineer", note="go", digest=digest)
    # Only the approvals are sent here (no webhook URL): the backend refuses this one for good.
    actions_only = OutboxDispatcher(rt.settings.model_copy(update={"webhook_url": None}), rt.db)
    try:
        backend.answers = [422]
        actions_only.run_once()
        [dead] = OutboxService(rt.db).list(task_id=task_id, kind="action", status="dead")
        assert _gauges(rt)[DEAD_ACTIONS] == 1.0
        OutboxService(rt.db).discard(dead.outbox_id, reason="the crew went anyway", by="ops")
        actions_only.run_once()
    finally:
        actions_only.close()
    assert len(backend.on("/actions")) == 1  # the refused send only
    assert _gauges(rt)[DEAD_ACTIONS] == 0.0
    rt.tasks.cancel(task_id, "done by hand")
    with rt.db.transaction(readonly=True) as conn:
        [cancelled] = events_of_type(conn, task_id, "action_task_cancelled", 10)
    assert cancelled.data["action"]["delivery"] == "discarded"


def test_the_cli_discards_with_who_and_why_and_refuses_in_one_line(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    dead_id = _refused_event(rt, tmp_path, backend, dispatcher)
    _cli_on(monkeypatch, store_url, tmp_path)
    with pytest.raises(SystemExit) as usage:  # the reason is required
        main(["outbox", "discard", str(dead_id)])
    assert usage.value.code == 2
    assert main(["outbox", "discard", str(dead_id), "--reason", "x", "--by", ""]) == 2
    assert "invalid --by" in capsys.readouterr().err
    reason = "handled by phone\n     9  webhook  delivered"  # typed text cannot forge a line
    assert main(["outbox", "discard", str(dead_id), "--reason", reason, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["status"], row["discarded_by"]) == ("discarded", getpass.getuser())
    assert main(["outbox", "list", "--status", "discarded"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.endswith(
        f"discarded by {getpass.getuser()}: handled by phone\\n     9  webhook  delivered"
    )
    assert main(["outbox", "discard", str(dead_id), "--reason", "again"]) == 1
    assert capsys.readouterr().err.strip().endswith("only a dead or pending one can be discarded")


def test_an_actions_record_says_where_its_delivery_stands(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    client: TestClient,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`GET /api/v1/actions/{id}` and `actions show`: none before the approval, then pending,
    dead (with what to do), discarded (never delivered); an approver sees whether the backend
    has the work order without reading the outbox."""
    from orchestrator.cli import main

    _cli_on(monkeypatch, store_url, tmp_path)
    task_id, action_id = waiting_task(rt, tmp_path)
    shown = client.get(f"/api/v1/actions/{action_id}", headers=bearer("viewer-token"))
    assert (shown.status_code, shown.json()["delivery"]) == (200, None)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="duty engineer", note="go", digest=digest)
    pending = client.get(f"/api/v1/actions/{action_id}", headers=bearer("viewer-token")).json()
    assert (pending["delivery"]["status"], pending["delivery"]["attempts"]) == ("pending", 0)
    actions_only = OutboxDispatcher(rt.settings.model_copy(update={"webhook_url": None}), rt.db)
    try:
        backend.answers = [422]
        actions_only.run_once()
    finally:
        actions_only.close()
    dead = client.get(f"/api/v1/actions/{action_id}", headers=bearer("viewer-token")).json()
    number = dead["delivery"]["outbox_id"]
    assert (dead["delivery"]["status"], dead["delivery"]["attempts"]) == ("dead", 1)
    assert main(["actions", "show", action_id]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "delivery:" in x)
    assert "dead after 1 attempt(s), last error: HTTP 422" in line
    assert f"orchestrator outbox retry {number}" in line
    OutboxService(rt.db).discard(number, reason="the crew went anyway", by="ops")
    assert main(["actions", "show", action_id, "--json"]) == 0
    delivery = json.loads(capsys.readouterr().out)["delivery"]
    assert (delivery["status"], delivery["discarded_by"], delivery["delivered_at"]) == (
        "discarded",
        "ops",
        None,
    )
    assert main(["actions", "show", action_id]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "delivery:" in x)
    assert "discarded by ops" in line
    assert "never delivered" in line
    assert task_id == dead["task_id"]


def test_the_action_list_shows_each_approved_actions_delivery_in_one_query(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    client: TestClient,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`GET /api/v1/actions` and `actions list`: an approved work order the backend refused
    is found in the list (before, only by opening each action), one still pending says it
    has no delivery, and the page's deliveries are read in one statement, not one a row."""
    from sqlalchemy import event

    from orchestrator.cli import main

    refused, delivered, undecided = (waiting_task(rt, tmp_path)[1] for _ in range(3))
    for action_id in (refused, delivered):
        digest = rt.actions.get(action_id).digest
        rt.actions.decide(action_id, approve=True, by="duty engineer", note=None, digest=digest)
    actions_only = OutboxDispatcher(rt.settings.model_copy(update={"webhook_url": None}), rt.db)
    try:
        backend.answers = [422]  # the older approval is sent first
        actions_only.run_once()
    finally:
        actions_only.close()
    sent: list[str] = []

    def keep(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    event.listen(rt.db.engine, "before_cursor_execute", keep)
    try:
        page = client.get("/api/v1/actions", params={"any": "true"}, headers=bearer("viewer-token"))
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", keep)
    assert page.status_code == 200, page.text
    listed = {i["action_id"]: i["delivery"] for i in page.json()["items"]}
    assert (listed[refused]["status"], listed[refused]["next_attempt_at"]) == ("dead", None)
    assert listed[delivered]["status"] == "delivered"
    assert listed[undecided] is None
    assert len([x for x in sent if "FROM outbox" in x]) == 1
    _cli_on(monkeypatch, store_url, tmp_path)
    assert main(["actions", "list", "--all", "--json"]) == 0
    rows = {r["action_id"]: r["delivery"] for r in json.loads(capsys.readouterr().out)}
    assert {k: v and v["status"] for k, v in rows.items()} == {
        refused: "dead",
        delivered: "delivered",
        undecided: None,
    }
    assert main(["actions", "list", "--all"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.strip().splitlines()}
    number = listed[refused]["outbox_id"]
    assert lines[refused].endswith(
        f"delivery dead: outbox retry {number} or discard it (outbox {number})"
    )
    assert lines[delivered].endswith(
        f"delivery delivered (outbox {listed[delivered]['outbox_id']})"
    )
    assert "delivery" not in lines[undecided]
    OutboxService(rt.db).retry(number, by="ops")
    assert main(["actions", "show", refused]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "delivery:" in x)
    assert "pending, 0 attempt(s), last error, before the retry: HTTP 422" in line
    # As `tasks show` prints a time, not Python's `2026-12-05 23:40:49.105250+00:00`.
    assert re.search(r"next attempt at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(outbox", line)


def test_every_dead_letter_is_retried_in_one_command_once_the_backend_is_mended(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    tasks = [waiting_task(rt, tmp_path)[0] for _ in range(3)]
    backend.always_fail, backend.fail_status = True, 401
    sender = OutboxDispatcher(rt.settings, rt.db)
    try:
        sender.run_once()
        assert len(OutboxService(rt.db).list(status="dead")) == 3  # one per task, at once
        _cli_on(monkeypatch, store_url, tmp_path)
        for wrong in (["outbox", "retry"], ["outbox", "retry", "1", "--all-dead"]):
            assert main(wrong) == 2
            assert "give one OUTBOX_ID, or --all-dead" in capsys.readouterr().err
        assert main(["outbox", "retry", "1", "--kind", "webhook"]) == 2
        assert "--kind and --task go with --all-dead" in capsys.readouterr().err
        backend.always_fail = False  # the secret is mended
        assert main(["outbox", "retry", "--all-dead", "--task", tasks[0], "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"retried": 1}
        assert main(["outbox", "retry", "--all-dead", "--kind", "action"]) == 0
        assert capsys.readouterr().out.strip() == "0 dead-lettered deliveries are due again"
        assert main(["outbox", "retry", "--all-dead", "--kind", "webhook"]) == 0
        assert capsys.readouterr().out.strip() == "2 dead-lettered deliveries are due again"
        pending = OutboxService(rt.db).list(status="pending")
        assert {(r.attempts, r.throttled) for r in pending} == {(0, 0)}  # fresh counts
        for _ in range(3):
            sender.run_once()
    finally:
        sender.close()
    assert OutboxService(rt.db).list(status="dead") == []
    assert OutboxService(rt.db).list(status="pending") == []
    assert {h.body["task_id"] for h in backend.on("/hooks") if h.body["seq"] == 4} == set(tasks)


def test_the_api_retries_every_dead_letter_for_an_operator_not_a_viewer(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """`POST /api/v1/outbox/retry-dead` (what the console's button sends): a viewer is refused,
    an operator makes every dead letter of the kind or task due again, with fresh counts."""
    from fastapi.testclient import TestClient

    from orchestrator.api.app import create_app
    from tests.integration.test_operator_accounts import TOKENS, bearer, operators_file

    tasks = [waiting_task(rt, tmp_path)[0] for _ in range(2)]
    backend.always_fail, backend.fail_status = True, 401
    sender = OutboxDispatcher(rt.settings, rt.db)
    try:
        sender.run_once()
    finally:
        sender.close()
    assert len(OutboxService(rt.db).list(status="dead")) == 2
    settings = rt.settings.model_copy(update={"operators": operators_file(tmp_path)})
    with TestClient(create_app(settings, db=rt.db)) as api:
        path = "/api/v1/outbox/retry-dead"
        refused = api.post(path, json={}, headers=bearer(TOKENS["vera"]))
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
        bad = api.post(path, json={"kind": "email"}, headers=bearer(TOKENS["otto"]))
        assert bad.status_code == 422
        one = api.post(path, json={"task_id": tasks[0]}, headers=bearer(TOKENS["otto"]))
        assert (one.status_code, one.json()) == (200, {"retried": 1})
        rest = api.post(path, headers=bearer(TOKENS["otto"]))  # no body: every dead letter
        assert rest.json() == {"retried": 1}
    assert OutboxService(rt.db).list(status="dead") == []
    assert {(r.attempts, r.throttled) for r in OutboxService(rt.db).list(status="pending")} == {
        (0, 0)
    }


def test_a_dispatch_from_where_no_url_is_set_says_what_it_does_not_send(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`outbox dispatch --once` on a laptop without the fleet's URLs printed `delivered 0,
    failed 0, ...` and exit 0, which read as nothing being due: it refuses in one line, and
    with one URL only, its report names the kind it left waiting."""
    from orchestrator.cli import main

    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="duty engineer", note=None, digest=digest)
    _cli_on(monkeypatch, store_url, tmp_path)
    assert main(["outbox", "dispatch", "--once"]) == 2
    assert "neither ORCH_ACTIONS_URL nor ORCH_WEBHOOK_URL is set here" in capsys.readouterr().err
    monkeypatch.setenv("ORCH_WEBHOOK_URL", f"{backend.url}/hooks")
    monkeypatch.setenv("ORCH_WEBHOOK_SECRET", "hook-secret")
    assert main(["outbox", "dispatch", "--once"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("delivered ")
    assert line.endswith("; not sent here: approved actions (ORCH_ACTIONS_URL is unset here)")
    assert backend.on("/actions") == []
    [waiting] = OutboxService(rt.db).list(task_id=task_id, kind="action")
    assert (waiting.status, waiting.attempts) == ("pending", 0)


def test_a_list_for_a_task_that_does_not_exist_says_so(
    rt: Runtime,
    tmp_path: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`outbox list --task` and `actions list --task` with a mistyped (or cut short) id said
    `no deliveries` and `no actions` (and `retry --all-dead --task` retried 0), as for a task
    with nothing to deliver: one line, exit 1."""
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    _cli_on(monkeypatch, store_url, tmp_path)
    for command in (["outbox", "list"], ["actions", "list"], ["outbox", "retry", "--all-dead"]):
        assert main([*command, "--task", task_id[:8]]) == 1
        assert capsys.readouterr().err.strip().endswith(f"task {task_id[:8]} does not exist")
    assert main(["outbox", "list", "--task", task_id, "--status", "discarded"]) == 0
    assert capsys.readouterr().out.strip() == "no deliveries"
    assert main(["actions", "list", "--task", task_id, "--status", "rejected"]) == 0
    assert capsys.readouterr().out.strip() == "no actions"


def test_the_api_says_a_task_that_does_not_exist_does_not_exist(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """`GET /api/v1/outbox?task_id=`, `POST /api/v1/outbox/retry-dead {"task_id"}` and
    `GET /api/v1/actions?task_id=` with a mistyped (or cut short) id answered an empty page and
    `{"retried": 0}`, as for a task with nothing to deliver, where the CLI says the task does
    not exist: a 404 `not_found` naming it; a real task with nothing to show is still empty."""
    task_id, _ = waiting_task(rt, tmp_path)
    short = task_id[:8]
    with TestClient(create_app(rt.settings, db=rt.db)) as api:
        answers = [
            api.get("/api/v1/outbox", params={"task_id": short}),
            api.post("/api/v1/outbox/retry-dead", json={"task_id": short}),
            api.get("/api/v1/actions", params={"task_id": short, "any": "true"}),
        ]
        for answer in answers:
            error = answer.json()["error"]
            assert (answer.status_code, error["code"]) == (404, "not_found")
            assert error["message"] == f"task {short} does not exist"
        empty = api.get("/api/v1/outbox", params={"task_id": task_id, "status": "discarded"})
        assert (empty.status_code, empty.json()["items"]) == (200, [])
        none = api.post("/api/v1/outbox/retry-dead", json={"task_id": task_id})
        assert none.json() == {"retried": 0}
        rejected = api.get("/api/v1/actions", params={"task_id": task_id, "status": "rejected"})
        assert (rejected.status_code, rejected.json()["items"]) == (200, [])
