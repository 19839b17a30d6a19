"""The outbox: rows commit with the change they report; the dispatcher delivers them.

Approved actions reach the backend once (idempotency key = action id), rejected ones never;
webhooks are signed, in order per task, dead-lettered after N failures and retried by an
operator. Both stores, a real HTTP backend on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store import outbox_views
from orchestrator.store import task_events as event_store
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task

SECRET = "webhook-secret-for-tests"
ACTIONS_SECRET = "actions-secret-for-tests"


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
        webhook_secret=SECRET,
        actions_secret=ACTIONS_SECRET,
    ) as runtime:
        yield runtime


@pytest.fixture
def dispatcher(rt: Runtime) -> Iterator[OutboxDispatcher]:
    sender = OutboxDispatcher(rt.settings, rt.db)
    yield sender
    sender.close()


def events(rt: Runtime, task_id: str) -> list[str]:
    with rt.db.transaction(readonly=True) as conn:
        return [e.type for e in event_store.events_after(conn, task_id, 0, 100)]


def verify(raw: bytes, header: str, secret: str = SECRET) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def test_an_approval_is_delivered_once_with_its_idempotency_key_and_events_are_signed(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    assert events(rt, task_id) == [
        "plan_revision",
        "plan_revision",
        "action_proposed",
        "waiting",
    ]
    rt.actions.decide(
        action_id,
        approve=True,
        by="duty engineer",
        note="go",
        digest=rt.actions.get(action_id).digest,
    )
    dispatcher.run_once()
    dispatcher.run_once()  # nothing is sent twice
    [delivery] = backend.on("/actions")
    assert delivery.headers["idempotency-key"] == action_id
    # The backend can tell an approval the orchestrator sent from a forged one: the body is
    # signed with the actions' own secret (not the webhooks').
    signature = delivery.headers["x-orchestrator-signature"]
    assert verify(delivery.raw, signature, ACTIONS_SECRET)
    assert not verify(delivery.raw, signature, SECRET)
    forged = delivery.raw.replace(b"duty engineer", b"duty engineeR")
    assert not verify(forged, signature, ACTIONS_SECRET)
    body: dict[str, Any] = delivery.body
    assert body["action_id"] == action_id
    assert (body["kind"], body["payload"], body["task_id"]) == (
        "work_order",
        {"crew": "north"},
        task_id,
    )
    assert (body["node_id"], body["approver"]) == ("repair", "duty engineer")
    hooks = backend.on("/hooks")
    assert [h.body["type"] for h in hooks] == ["action_proposed", "waiting", "action_decided"]
    assert [h.body["event_id"] for h in hooks] == [f"{task_id}:{n}" for n in (3, 4, 5)]
    for hook in hooks:
        assert verify(hook.raw, hook.headers["x-orchestrator-signature"])
        assert hook.body["task_id"] == task_id
        assert hook.body["generation"] == 1
        assert {"status", "reason", "time"} <= hook.body.keys()
    assert not verify(hooks[0].raw + b" ", hooks[0].headers["x-orchestrator-signature"])
    rows = OutboxService(rt.db).list(task_id=task_id)
    assert {(r.kind, r.status, r.attempts) for r in rows} == {
        ("action", "delivered", 1),
        ("webhook", "delivered", 1),
    }
    assert all(r.delivered_at is not None for r in rows)


def test_a_rejected_action_is_never_delivered(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(action_id, approve=False, by="duty engineer", note="no")
    rt.tasks.cancel(task_id, "not needed")
    dispatcher.run_once()
    assert backend.on("/actions") == []
    decided = [h.body for h in backend.on("/hooks") if h.body["type"] == "action_decided"]
    assert decided[0]["action"]["status"] == "rejected"
    assert backend.on("/hooks")[-1].body["type"] == "cancelled"


def test_a_2xx_is_a_delivery_however_slowly_the_body_of_the_answer_follows(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    # The backend said 200 at once: waiting for (or timing out on) the rest of its answer
    # would count a delivery as failed and send the event again.
    task_id, _ = waiting_task(rt, tmp_path)
    backend.body_delay_seconds = rt.settings.outbox_timeout_seconds + 1
    report = dispatcher.run_once()
    assert (len(report.delivered), report.failed) == (2, [])
    assert [h.body["seq"] for h in backend.on("/hooks")] == [3, 4]
    rows = OutboxService(rt.db).list(task_id=task_id)
    assert [(r.status, r.attempts, r.last_error) for r in rows] == [("delivered", 1, None)] * 2


def test_retries_back_off_until_a_2xx_and_webhooks_stay_in_order(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(
        action_id,
        approve=True,
        by="duty engineer",
        note=None,
        digest=rt.actions.get(action_id).digest,
    )
    backend.fail_first = 2
    for _ in range(40):
        dispatcher.run_once()
        if not OutboxService(rt.db).list(task_id=task_id, status="pending"):
            break
    assert backend.applied == [action_id]
    delivered = [h.body["seq"] for h in backend.on("/hooks")]
    # Each event arrives at least once, and never before an earlier event was delivered.
    assert sorted(set(delivered)) == [3, 4, 5]
    first_seen = [seq for i, seq in enumerate(delivered) if seq not in delivered[:i]]
    assert first_seen == [3, 4, 5]
    failed = [r for r in OutboxService(rt.db).list(task_id=task_id) if r.attempts > 1]
    assert failed
    assert all(r.status == "delivered" for r in failed)


def test_a_failed_sends_text_on_the_row_masks_a_secret_in_the_webhook_path(
    rt: Runtime, tmp_path: Path
) -> None:
    """The row's last error is read by viewers (API, CLI, console): a transport error that
    names the URL (a proxy's, say) must not carry a Slack-style webhook's secret path."""
    import httpx

    task_id, _ = waiting_task(rt, tmp_path)
    hook = "https://hooks.example.test/services/T000/B000/XXXXsecretpath"
    settings = rt.settings.model_copy(update={"webhook_url": hook, "actions_url": None})

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"proxy refused the tunnel to {request.url}", request=request)

    sender = OutboxDispatcher(
        settings, rt.db, client=httpx.Client(transport=httpx.MockTransport(refuse))
    )
    try:
        sender.run_once()
    finally:
        sender.close()
    failed = [r for r in OutboxService(rt.db).list(task_id=task_id) if r.last_error]
    assert failed
    for row in failed:
        assert row.last_error is not None
        assert row.last_error.startswith("ConnectError: proxy refused the tunnel to https://hooks")
        assert "XXXXsecretpath" not in row.last_error
        assert "/services/T000/B000" not in row.last_error


def test_a_webhook_is_dead_lettered_after_n_failures_holds_the_next_and_an_operator_retries(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher, store_url: str
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail = True
    for _ in range(40):
        dispatcher.run_once()
        if OutboxService(rt.db).list(task_id=task_id, status="dead"):
            break
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    assert (dead.event_seq, dead.attempts, dead.last_error) == (3, 3, "HTTP 503")
    assert {h.body["seq"] for h in backend.on("/hooks")} == {3}  # seq 4 waits behind it
    view = rt.tasks.explain(task_id)
    assert view["deliveries"]["undelivered"][0]["status"] == "dead"
    backend.always_fail = False
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        listed = client.get("/api/v1/outbox", params={"status": "dead"}).json()
        assert [item["outbox_id"] for item in listed["items"]] == [dead.outbox_id]
        assert listed["next_cursor"] is None
        assert client.post(f"/api/v1/outbox/{dead.outbox_id}/retry").status_code == 200
        # Retried again before a dispatcher took it: pending and due, it stays due now (a
        # retry of a pending row hurries it), its counts fresh from the first retry.
        again = client.post(f"/api/v1/outbox/{dead.outbox_id}/retry")
        assert again.status_code == 200, again.text
        assert (again.json()["status"], again.json()["attempts"]) == ("pending", 0)
        assert client.post("/api/v1/outbox/999999/retry").json()["error"]["code"] == "not_found"
    dispatcher.run_once()
    assert [h.body["seq"] for h in backend.on("/hooks")][-2:] == [3, 4]
    assert OutboxService(rt.db).list(task_id=task_id, status="pending") == []


def _store_gauges(rt: Runtime) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.metrics import render

    return {
        f"{s.name}{sorted(s.labels.items()) or ''}": s.value
        for family in text_string_to_metric_families(render(rt.db).decode())
        for s in family.samples
        if s.name.startswith("orchestrator_outbox_") and not s.name.endswith(("_total", "_created"))
    }


def test_the_metrics_count_dead_letters_and_the_oldest_pending_delivery_from_the_store(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    """What an operator alerts on, read from the store at scrape time: 0 before any failure,
    then the dead-lettered webhook; the event held behind it is not deliverable and its age is
    not counted (it paged as a slow dispatcher or backend, on top of the dead letter's alert),
    until the dead letter is retried."""
    dead_webhooks = "orchestrator_outbox_dead[('kind', 'webhook')]"
    assert _store_gauges(rt) == {
        "orchestrator_outbox_dead[('kind', 'action')]": 0.0,
        dead_webhooks: 0.0,
        "orchestrator_outbox_oldest_pending_seconds[('kind', 'action')]": 0.0,
        "orchestrator_outbox_oldest_pending_seconds[('kind', 'webhook')]": 0.0,
    }
    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail = True
    for _ in range(40):
        dispatcher.run_once()
        if OutboxService(rt.db).list(task_id=task_id, status="dead"):
            break
    with rt.db.transaction() as conn:  # the task's events were committed a minute ago
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id)
            .values(created_at=utcnow() - timedelta(seconds=60))
        )
    oldest_webhook = "orchestrator_outbox_oldest_pending_seconds[('kind', 'webhook')]"
    gauges = _store_gauges(rt)
    assert gauges[dead_webhooks] == 1.0
    assert gauges["orchestrator_outbox_dead[('kind', 'action')]"] == 0.0
    # The held webhook, a minute old, waits for an operator, not for the dispatcher.
    [held] = OutboxService(rt.db).list(task_id=task_id, status="pending")
    assert held.kind == "webhook"
    assert gauges[oldest_webhook] == 0.0
    # By kind: no action waits (an unconfigured kind's rows wait on purpose, and must not make
    # an alert on the other kind fire).
    assert gauges["orchestrator_outbox_oldest_pending_seconds[('kind', 'action')]"] == 0.0
    # Retried, the dead letter is deliverable again: it counts, waiting since the retry (and
    # so does the event it held back), not since it was written a minute ago.
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    OutboxService(rt.db).retry(dead.outbox_id, by="ops")
    assert 0 <= _store_gauges(rt)[oldest_webhook] < 30


def _age(rt: Runtime, task_id: str, seconds: float) -> None:
    """The task's outbox rows written `seconds` ago, as is their `released_at` if they have
    one (so much time passed since)."""
    then = utcnow() - timedelta(seconds=seconds)
    with rt.db.transaction() as conn:
        conn.execute(update(outbox).where(outbox.c.task_id == task_id).values(created_at=then))
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.released_at.is_not(None))
            .values(released_at=then)
        )


def test_the_oldest_pending_age_of_a_retried_or_discarded_dead_letter_starts_at_the_operator(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    """The gauge measured a row's wait from when it was written: an operator's retry of a
    three-day-old dead letter read three days at once, and so did each event of its task it
    had held back, in order, until all were delivered: an alert on the age fired for a backlog
    that was draining. Now from the later of the writing and the operator's retry or discard;
    a backend that keeps failing the retried row still shows, its wait growing from the retry."""
    oldest_webhook = "orchestrator_outbox_oldest_pending_seconds[('kind', 'webhook')]"
    three_days = 3 * 86400
    backend.always_fail = True
    retried_task, _ = waiting_task(rt, tmp_path)
    discarded_task, _ = waiting_task(rt, tmp_path)
    for _ in range(40):
        dispatcher.run_once()
        if all(
            OutboxService(rt.db).list(task_id=t, status="dead")
            for t in (retried_task, discarded_task)
        ):
            break
    for task_id in (retried_task, discarded_task):
        _age(rt, task_id, three_days)
        assert OutboxService(rt.db).list(task_id=task_id, status="pending")  # held behind it
    assert _store_gauges(rt)[oldest_webhook] == 0.0  # every pending one is held

    [dead] = OutboxService(rt.db).list(task_id=retried_task, status="dead")
    OutboxService(rt.db).retry(dead.outbox_id, by="ops")
    assert _store_gauges(rt)[oldest_webhook] < 30  # was three days
    dispatcher.run_once()  # the backend still fails it: its wait grows from the retry
    assert OutboxService(rt.db).list(task_id=retried_task)[0].attempts == 1
    assert _store_gauges(rt)[oldest_webhook] < 30
    _age(rt, retried_task, 600)
    assert 600 <= _store_gauges(rt)[oldest_webhook] < 630

    [dead] = OutboxService(rt.db).list(task_id=discarded_task, status="dead")
    OutboxService(rt.db).discard(dead.outbox_id, reason="sent by hand", by="otto")
    _age(rt, retried_task, 0)  # only the events the discard released are left to read
    assert _store_gauges(rt)[oldest_webhook] < 30  # the events behind it: three days before
    backend.always_fail = False
    for _ in range(10):
        dispatcher.run_once()
    assert _store_gauges(rt)[oldest_webhook] == 0.0


def test_a_kind_without_its_url_has_no_oldest_pending_age_to_page_on(
    store_url: str, tmp_path: Path
) -> None:
    """With ORCH_WEBHOOK_URL unset the task events wait on purpose (kept for a URL set later):
    the age of the oldest one would only grow, so an alert on it would always fire. The API's
    /metrics has no series for it; the action kind, whose URL is set, keeps its row."""
    rt, _ = runtime_for(
        store_url,
        tmp_path / "scripts",
        actions_url="http://127.0.0.1:9/actions",
        actions_secret=ACTIONS_SECRET,
    )
    try:
        task_id, _ = waiting_task(rt, tmp_path)
        with rt.db.transaction() as conn:  # the task's events were committed an hour ago
            conn.execute(
                update(outbox)
                .where(outbox.c.task_id == task_id)
                .values(created_at=utcnow() - timedelta(hours=1))
            )
        assert OutboxService(rt.db).list(task_id=task_id, status="pending")  # kept, unsent
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            scraped = client.get("/metrics")
        assert scraped.status_code == 200
        ages = [
            line
            for line in scraped.text.splitlines()
            if line.startswith("orchestrator_outbox_oldest_pending_seconds{")
        ]
        assert ages == ['orchestrator_outbox_oldest_pending_seconds{kind="action"} 0.0']
    finally:
        rt.close()


def test_an_action_retried_a_thousand_times_still_backs_off_to_the_maximum(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    # Retried until a 2xx: at the 300 s maximum, 1,100 attempts are under four days.
    task_id, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(
        action_id,
        approve=True,
        by="duty engineer",
        note=None,
        digest=rt.actions.get(action_id).digest,
    )
    with rt.db.transaction() as conn:
        conn.execute(update(outbox).where(outbox.c.action_id == action_id).values(attempts=1100))
    backend.always_fail = True
    before = utcnow()
    dispatcher.run_once()
    assert len(backend.on("/actions")) == 1
    [row] = OutboxService(rt.db).list(task_id=task_id, kind="action")
    assert (row.status, row.attempts, row.last_error) == ("pending", 1101, "HTTP 503")
    maximum = timedelta(seconds=rt.settings.outbox_backoff_max_seconds)
    assert before + maximum <= row.next_attempt_at <= utcnow() + maximum


def _undated(line: str) -> str:
    """A listed row without how long ago it came due, which moves on between two commands
    (`next attempt due` becomes `next attempt due 2s ago` on a loaded machine)."""
    return re.sub(r"next attempt due.*$", "next attempt due", line)


def test_the_cli_lists_and_retries_with_one_line_errors(
    rt: Runtime,
    tmp_path: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    assert main(["outbox", "list", "--task", task_id]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2
    assert all("webhook  pending" in line for line in listed)
    first = int(listed[0].split()[0])
    # A page cut short says so and how to read on (it was silently the oldest N).
    assert main(["outbox", "list", "--task", task_id, "--limit", "1"]) == 0
    page = capsys.readouterr().out.splitlines()
    assert [_undated(line) for line in page] == [
        _undated(listed[0]),
        f"more follow: the same command with --after {first}",
    ]
    assert main(["outbox", "list", "--task", task_id, "--limit", "1", "--after", str(first)]) == 0
    assert [_undated(line) for line in capsys.readouterr().out.splitlines()] == [
        _undated(listed[1])
    ]
    # --json too: stdout stays one JSON array, and the way on goes to stderr (as `tasks list`).
    assert main(["outbox", "list", "--task", task_id, "--limit", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [row["outbox_id"] for row in json.loads(out)] == [first]
    assert err.strip() == f"more follow: the same command with --after {first}"
    assert main(["outbox", "list", "--task", task_id, "--after", str(first), "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)) == 1
    assert err == ""
    # A pending row is due now on a retry (this one, never tried, was due already).
    assert main(["outbox", "retry", str(first)]) == 0
    assert capsys.readouterr().out == f"outbox {first} is due again (task {task_id})\n"
    assert main(["outbox", "retry", "424242"]) == 1
    assert "not_found" in capsys.readouterr().err
    assert main(["outbox", "retry", str(2**63 - 1)]) == 1  # a 64-bit id: looked up, none such
    assert "not_found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["outbox", "retry", "zero"])
    assert bad.value.code == 2


def test_the_dispatcher_alone_masks_the_credentials_of_the_urls_it_logs(
    rt: Runtime, tmp_path: Path, store_url: str, backend: Recorder
) -> None:
    # httpx logs every request's URL at INFO: a backend's password, a query token or a
    # Slack-style secret in the path must be masked there as in the sweeper's dispatcher thread.
    task_id, _ = waiting_task(rt, tmp_path)
    address = backend.url.removeprefix("http://")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        ORCH_DATABASE_URL=store_url,
        ORCH_HOME=str(tmp_path / "home"),
        ORCH_WEBHOOK_URL=(
            f"http://hooks:url-password-42@{address}/services/T000/B000/path-secret-42"
            "?token=query-token-42"
        ),
        ORCH_WEBHOOK_SECRET=SECRET,
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "orchestrator"), "outbox", "dispatch", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [r.body["task_id"] for r in backend.received] == [task_id, task_id]
    # The request lines are there, with where they went, masked.
    sent = [line for line in result.stderr.splitlines() if "HTTP Request: POST" in line]
    assert len(sent) == 2, result.stderr
    assert all(address in line for line in sent), result.stderr
    for secret in ("url-password-42", "query-token-42", "path-secret-42", "T000", "B000"):
        assert secret not in result.stderr, result.stderr


def test_concurrent_producers_get_one_gapless_seq_per_task_in_commit_order(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    before = len(events(rt, task_id))
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            for i in range(5):
                with rt.db.transaction() as conn:
                    event_store.record_event(conn, task_id, "note", reason=f"{n}.{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with rt.db.transaction(readonly=True) as conn:
        logged = event_store.events_after(conn, task_id, 0, 200)
    assert [e.seq for e in logged] == list(range(1, before + 31))
    assert all(e.created_at <= f.created_at for e, f in itertools.pairwise(logged))


def test_two_dispatchers_share_the_work_without_sending_a_row_twice_or_out_of_order(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    tasks = [waiting_task(rt, tmp_path) for _ in range(3)]
    for _, action_id in tasks:
        rt.actions.decide(
            action_id,
            approve=True,
            by="duty engineer",
            note=None,
            digest=rt.actions.get(action_id).digest,
        )
    senders = [OutboxDispatcher(rt.settings, rt.db, batch=2) for _ in range(2)]
    errors: list[BaseException] = []

    def drain(sender: OutboxDispatcher) -> None:
        try:
            for _ in range(20):
                sender.run_once()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(sender,)) for sender in senders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for sender in senders:
        sender.close()
    assert errors == []
    assert sorted(backend.applied) == sorted(action for _, action in tasks)
    assert len(backend.on("/actions")) == 3  # nobody crashed: each sent once
    for task_id, _ in tasks:
        seqs = [h.body["seq"] for h in backend.on("/hooks") if h.body["task_id"] == task_id]
        assert seqs == [3, 4, 5]


def approve_three(rt: Runtime, tmp_path: Path) -> None:
    """Three waiting tasks, each with an approved action queued for delivery."""
    for _ in range(3):
        _, action_id = waiting_task(rt, tmp_path)
        rt.actions.decide(
            action_id, approve=True, by="ana", note=None, digest=rt.actions.get(action_id).digest
        )


def actions_dispatcher(rt: Runtime, url: str, batch: int = 20) -> OutboxDispatcher:
    """A dispatcher of approved actions only, to `url`, with time for a held send."""
    only_actions = {"webhook_url": None, "outbox_timeout_seconds": 30.0, "actions_url": url}
    return OutboxDispatcher(rt.settings.model_copy(update=only_actions), rt.db, batch=batch)


def test_a_row_whose_hold_ran_out_before_its_turn_in_a_batch_is_left_to_its_new_claimant(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    # Dispatcher `first` claims three approvals and sends them one after another; while its
    # first send waits on the backend, the hold of the other two runs out (rewound here, as
    # if that send had taken the whole hold) and dispatcher `second` claims and sends them.
    approve_three(rt, tmp_path)
    first = actions_dispatcher(rt, f"{backend.url}/slow", batch=3)
    second = actions_dispatcher(rt, f"{backend.url}/fast")
    backend.slow_path, backend.delay_seconds = "/slow", 30.0
    sender = threading.Thread(target=first.run_once)
    sender.start()
    try:
        assert backend.arrived.wait(30)
        [in_flight] = backend.on("/slow")
        with rt.db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(
                    outbox.c.kind == "action",
                    outbox.c.outbox_id != int(in_flight.headers["x-orchestrator-delivery"]),
                )
                .values(next_attempt_at=utcnow() - timedelta(seconds=1))
            )
        assert len(second.run_once().delivered) == 2
    finally:
        backend.release.set()
        sender.join(timeout=30)
        first.close()
        second.close()
    keys = [r.headers["idempotency-key"] for r in backend.received]
    assert len(keys) == 3, [r.path for r in backend.received]  # each approval sent once
    assert len(set(keys)) == 3
    assert {r.status for r in OutboxService(rt.db).list(kind="action")} == {"delivered"}


def test_a_batch_of_events_keeps_each_tasks_seq_gapless_and_queues_their_webhooks(
    rt: Runtime, tmp_path: Path
) -> None:
    first, _ = waiting_task(rt, tmp_path)
    second, _ = waiting_task(rt, tmp_path)
    before = {t: len(events(rt, t)) for t in (first, second)}
    batch = [
        event_store.NewEvent(first, "queued", 2, reason="generation 1: lease_expired"),
        event_store.NewEvent(second, "failed", reason="recovery_limit"),
        event_store.NewEvent(first, "note", reason="a second event of the same task"),
    ]
    with rt.db.transaction() as conn:  # single-threaded here: no row locks needed
        recorded = event_store.record_events(conn, batch)
    assert [(e.task_id, e.type, e.seq) for e in recorded] == [
        (first, "queued", before[first] + 1),
        (second, "failed", before[second] + 1),
        (first, "note", before[first] + 2),
    ]
    assert recorded[0].generation == 2
    assert recorded[2].reason == batch[2].reason
    with rt.db.transaction(readonly=True) as conn:
        for task_id in (first, second):
            logged = event_store.events_after(conn, task_id, 0, 100)
            assert [e.seq for e in logged] == list(range(1, len(logged) + 1))
        hooks = outbox_views.list_rows(conn, kind="webhook", limit=100)
    assert (second, recorded[1].seq) in {(h.task_id, h.event_seq) for h in hooks}
    assert not {(first, recorded[0].seq), (first, recorded[2].seq)} & {
        (h.task_id, h.event_seq) for h in hooks
    }


def test_the_api_pages_deliveries_with_a_cursor_only_when_more_follow(
    rt: Runtime, tmp_path: Path
) -> None:
    waiting_task(rt, tmp_path)
    waiting_task(rt, tmp_path)
    every = [row.outbox_id for row in OutboxService(rt.db).list(limit=200)]
    assert len(every) >= 2
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        whole = client.get("/api/v1/outbox", params={"limit": len(every)}).json()
        assert [item["outbox_id"] for item in whole["items"]] == every
        assert whole["next_cursor"] is None  # it used to lead to an empty page
        first = client.get("/api/v1/outbox", params={"limit": len(every) - 1}).json()
        assert first["next_cursor"] == str(every[-2])
        rest = client.get(
            "/api/v1/outbox", params={"limit": len(every) - 1, "cursor": first["next_cursor"]}
        ).json()
        assert ([item["outbox_id"] for item in rest["items"]], rest["next_cursor"]) == (
            every[-1:],
            None,
        )
        # An id the store cannot hold is no delivery (it was a 422 on Postgres).
        beyond = client.post(f"/api/v1/outbox/{2**31}/retry")
        assert (beyond.status_code, beyond.json()["error"]["code"]) == (404, "not_found")
        too_big = client.post(f"/api/v1/outbox/{2**63}/retry")
        assert (too_big.status_code, too_big.json()["error"]["code"]) == (422, "invalid_request")


def test_outbox_ids_past_32_bits_are_stored_listed_and_retried(rt: Runtime, tmp_path: Path) -> None:
    # Ids are never reused, so a busy outbox passes 2^31 - 1: a 64-bit id on both stores.
    waiting_task(rt, tmp_path)
    big = 2**31 + 7
    with rt.db.transaction() as conn:
        [first, *_] = outbox_views.list_rows(conn, limit=1)
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == first.outbox_id)
            .values(outbox_id=big, status="dead")
        )
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        page = client.get("/api/v1/outbox", params={"cursor": 2**31, "limit": 10}).json()
        assert [(item["outbox_id"], item["status"]) for item in page["items"]] == [(big, "dead")]
        retried = client.post(f"/api/v1/outbox/{big}/retry")
        assert retried.status_code == 200, retried.text
        assert (retried.json()["outbox_id"], retried.json()["status"]) == (big, "pending")


def test_a_stopping_dispatcher_gives_back_the_rows_of_its_batch_it_did_not_send(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    # The sweeper stops (SIGTERM) while its dispatcher waits on the first send of a batch:
    # the two rows after it are not sent, and are due again at once with no attempt counted
    # (they used to stay held, and a webhook's unsent claims counted towards its dead letter).
    approve_three(rt, tmp_path)
    first = actions_dispatcher(rt, f"{backend.url}/slow", batch=3)
    backend.slow_path, backend.delay_seconds = "/slow", 30.0
    stop = threading.Event()
    sender = threading.Thread(target=first.run, args=(stop,))
    sender.start()
    try:
        assert backend.arrived.wait(30)
        stop.set()
    finally:
        backend.release.set()
        sender.join(timeout=30)
        first.close()
    assert not sender.is_alive()
    assert len(backend.received) == 1
    rows = OutboxService(rt.db).list(kind="action")
    sent = int(backend.received[0].headers["x-orchestrator-delivery"])
    assert {(r.status, r.attempts) for r in rows if r.outbox_id != sent} == {("pending", 0)}
    assert all(r.next_attempt_at <= utcnow() for r in rows if r.outbox_id != sent)
    second = actions_dispatcher(rt, f"{backend.url}/fast")
    try:
        assert len(second.run_once().delivered) == 2
    finally:
        second.close()


def test_an_event_as_recorded_is_the_event_as_the_log_reads_it_back(
    rt: Runtime, tmp_path: Path
) -> None:
    # On Postgres a single event comes back from its INSERT with only the columns the store
    # filled in (seq, generation, status); the rest is the caller's: all must match the row.
    task_id, _ = waiting_task(rt, tmp_path)
    data = {"nested": [1, "浊度", {"k": None}], "n": 2.5}
    with rt.db.transaction() as conn:
        noted = event_store.record_event(conn, task_id, "note", reason="why", data=data)
        ended = event_store.record_event(conn, task_id, "failed", reason="it broke")
    with rt.db.transaction(readonly=True) as conn:
        logged = event_store.events_after(conn, task_id, noted.seq - 1, 10)
        hooks = outbox_views.list_rows(conn, task_id=task_id, kind="webhook")
    assert logged == [noted, ended]
    assert (noted.generation, noted.status) == (ended.generation, "waiting")
    assert noted.created_at.tzinfo is not None
    assert noted.created_at.utcoffset() == timedelta(0)
    (hook,) = [row for row in hooks if row.event_seq == ended.seq]
    assert (hook.status, hook.attempts, hook.kind) == ("pending", 0, "webhook")
    assert hook.body == event_store.event_json(event_store.webhook_body(ended))


def test_tasks_show_says_when_no_delivery_of_a_kind_was_ever_sent_not_attempts_0(
    store_url: str, tmp_path: Path
) -> None:
    """Without ORCH_WEBHOOK_URL the events wait unsent; "webhook pending 2, attempts 0" read
    like a stuck dispatcher. `tasks show` (often run without the fleet's settings) says what
    the store knows: nothing of the kind was ever sent from it, and which setting sends it."""
    from orchestrator.cli.task_show import render_explain

    rt, _ = runtime_for(store_url, tmp_path / "scripts")
    try:
        task_id, _ = waiting_task(rt, tmp_path)
        view = rt.tasks.explain(task_id)
        assert view["deliveries"]["never_sent"] == ["webhook"]
        shown = render_explain(view)
        assert (
            "no task event webhook in this store was delivered, dead-lettered or tried (delivered "
            "ones are kept ORCH_RETENTION_DAYS): they wait until ORCH_WEBHOOK_URL is set where the "
            "sweeper or `outbox dispatch` runs"
        ) in shown, shown
        assert "attempts 0" not in shown, shown
        assert "never attempted, written 20" in shown, shown
        # One tried and still pending (a receiver failing every time) is a dispatcher that
        # sends them too: the note, which sent an operator to set a URL already set, goes.
        with rt.db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.outbox_id == view["deliveries"]["undelivered"][-1]["outbox_id"])
                .values(attempts=2, last_error="HTTP 503")
            )
        tried = rt.tasks.explain(task_id)
        assert tried["deliveries"]["never_sent"] == []
        assert "no task event webhook in this store" not in render_explain(tried)
        # Once one webhook of any task was delivered, a dispatcher sends them: no such note.
        with rt.db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.outbox_id == view["deliveries"]["undelivered"][-1]["outbox_id"])
                .values(status="delivered", attempts=1, delivered_at=utcnow())
            )
        again = rt.tasks.explain(task_id)
        assert again["deliveries"]["never_sent"] == []
        assert "no task event webhook in this store" not in render_explain(again)
    finally:
        rt.close()
