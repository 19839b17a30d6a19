"""What the dispatcher makes of the business backend's answers, and how it signs what it sends.

A permanent refusal (a 4xx other than 408, 409, 425, 429) dead-letters the row at once, an
approved action as a webhook, for an operator to retry; `Retry-After` on 429 or 503 sets the next
attempt; every delivery carries a signature over its id, its send time and its body. Both
stores, a real HTTP backend on loopback.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.documents import ROOT
from tests.outbox_support import (
    Recorder,
    approved_action,
    outbox_runtime,
    running_recorder,
    waiting_task,
)

SECRET = "webhook-secret-for-answers"
ACTIONS_SECRET = "actions-secret-for-answers"
#: The chapter for the business backend, with the verification example it gives receivers.
BACKEND_DOC = ROOT / "docs" / "business-backend.md"


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
        outbox_backoff_max_seconds=300,
    ) as runtime:
        yield runtime


def actions_only(rt: Runtime) -> OutboxDispatcher:
    """A dispatcher of approved actions alone (the task's webhooks wait)."""
    return OutboxDispatcher(rt.settings.model_copy(update={"webhook_url": None}), rt.db)


def action_row(rt: Runtime, task_id: str) -> OutboxRow:
    [row] = OutboxService(rt.db).list(task_id=task_id, kind="action")
    return row


def dead_actions_gauge(rt: Runtime) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.metrics import render

    for family in text_string_to_metric_families(render(rt.db).decode()):
        for sample in family.samples:
            if sample.name == "orchestrator_outbox_dead" and sample.labels == {"kind": "action"}:
                return float(sample.value)
    raise AssertionError("orchestrator_outbox_dead{kind=action} is not exported")


def test_an_action_refused_for_good_is_dead_lettered_at_once_and_an_operator_retries_it(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A 422 is the backend's final word on this body: it used to be sent again for ever.
    task_id, action_id = approved_action(rt, tmp_path)
    backend.always_fail, backend.fail_status = True, 422
    dispatcher = actions_only(rt)
    try:
        with caplog.at_level(logging.DEBUG):
            report = dispatcher.run_once()
            assert dispatcher.run_once().sent == 0  # nothing more goes out
        row = action_row(rt, task_id)
        assert (report.dead, report.failed) == ([row.outbox_id], [])
        assert (row.status, row.attempts) == ("dead", 1)
        assert row.last_error is not None
        assert "HTTP 422" in row.last_error
        assert len(backend.on("/actions")) == 1
        assert dead_actions_gauge(rt) == 1.0
        [line] = [m for m in caplog.messages if m.startswith(f"outbox {row.outbox_id} ")]
        assert "HTTP 422" in line
        assert "dead-lettered" in line
        assert not any(s in caplog.text for s in (SECRET, ACTIONS_SECRET))

        # The operator retries it as a dead webhook: the CLI first (refused again, dead again)...
        from orchestrator.cli import main

        monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
        monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
        assert main(["outbox", "retry", str(row.outbox_id)]) == 0
        assert f"outbox {row.outbox_id} is due again" in capsys.readouterr().out
        assert dispatcher.run_once().dead == [row.outbox_id]
        assert action_row(rt, task_id).status == "dead"
        # ...then the API, once the backend takes it.
        backend.always_fail = False
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            retried = client.post(f"/api/v1/outbox/{row.outbox_id}/retry")
            assert retried.status_code == 200, retried.text
            assert (retried.json()["status"], retried.json()["attempts"]) == ("pending", 0)
        assert dispatcher.run_once().delivered == [row.outbox_id]
    finally:
        dispatcher.close()
    assert backend.applied == [action_id]
    assert [r.headers["idempotency-key"] for r in backend.on("/actions")] == [action_id] * 3
    assert (action_row(rt, task_id).status, dead_actions_gauge(rt)) == ("delivered", 0.0)


def test_a_webhook_refused_for_good_is_dead_lettered_without_spending_its_attempts(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail, backend.fail_status = True, 401
    dispatcher = OutboxDispatcher(rt.settings, rt.db)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    assert (dead.event_seq, dead.attempts) == (3, 1)  # not ORCH_WEBHOOK_MAX_ATTEMPTS (3)
    assert dead.last_error is not None
    assert "HTTP 401" in dead.last_error
    # A 401 is most often a secret the backend does not hold: the error names the setting
    # (never its value).
    assert "check that it verifies with ORCH_WEBHOOK_SECRET" in dead.last_error
    assert rt.settings.webhook_secret is not None
    assert rt.settings.webhook_secret not in dead.last_error
    assert [h.body["seq"] for h in backend.on("/hooks")] == [3]  # seq 4 waits behind it


def _in(seconds: float) -> Callable[[], str]:
    return lambda: format_datetime(utcnow() + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("status", "retry_after", "wait"),
    [
        (429, "120", 120.0),  # seconds
        (503, _in(90), 90.0),  # an HTTP date
        (503, "100000", 300.0),  # capped by ORCH_OUTBOX_BACKOFF_MAX_SECONDS
        (429, "0", None),  # never earlier than the backoff
        (503, _in(-3600), None),  # a date past: never a negative wait
        (429, "soon", None),  # neither: ignored
        (500, "120", None),  # honoured on 429 and 503 only
        (408, None, None),  # the retryable client errors keep the backoff
        (409, None, None),
        (425, None, None),
    ],
)
def test_a_retryable_answer_backs_off_and_retry_after_sets_the_next_attempt(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    status: int,
    retry_after: str | Callable[[], str] | None,
    wait: float | None,
) -> None:
    task_id, _ = approved_action(rt, tmp_path)
    backend.always_fail, backend.fail_status = True, status
    # Before the date is written: an HTTP date drops the fraction of a second it was made in,
    # so "now + 90 s" may say 89.01 s after the dispatcher starts.
    before = utcnow()
    if retry_after is not None:
        value = retry_after() if callable(retry_after) else retry_after
        backend.fail_headers = {"Retry-After": value}
    # The answer's body follows late: the status line and headers are the answer.
    backend.body_delay_seconds = rt.settings.outbox_timeout_seconds + 1
    dispatcher = actions_only(rt)
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
    after = utcnow()
    assert (after - before).total_seconds() < rt.settings.outbox_timeout_seconds
    row = action_row(rt, task_id)
    # A 429 backs off as the others do, and is counted apart (the backend asked for time).
    throttled = status == 429
    assert (report.throttled if throttled else report.failed) == [row.outbox_id]
    assert (row.status, row.attempts, row.throttled) == ("pending", 1, int(throttled))
    assert row.last_error == (f"HTTP {status} (throttled)" if throttled else f"HTTP {status}")
    if wait is None:  # the first backoff, 0.01 s
        assert row.next_attempt_at <= after + timedelta(seconds=1)
    else:  # an HTTP date has whole seconds
        assert before + timedelta(seconds=wait - 1) <= row.next_attempt_at
        assert row.next_attempt_at <= after + timedelta(seconds=wait)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_and_says_which_setting_to_mend(
    rt: Runtime, tmp_path: Path, backend: Recorder, status: int
) -> None:
    """A backend that moved (an http:// URL now answered from https://) answers a redirect: a
    signed POST is not sent elsewhere; the row backs off as a failure and its error says what
    to change, where a bare `HTTP 301` left the operator guessing."""
    task_id, _ = approved_action(rt, tmp_path)
    backend.always_fail, backend.fail_status = True, status
    backend.fail_headers = {"Location": "https://elsewhere.example/actions"}
    dispatcher = actions_only(rt)
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
    row = action_row(rt, task_id)
    assert report.failed == [row.outbox_id]
    assert (row.status, row.attempts, row.throttled) == ("pending", 1, 0)
    assert row.last_error == (
        f"HTTP {status} (a redirect, not followed: set ORCH_ACTIONS_URL to the address the "
        "backend answers at)"
    )
    assert [r.path for r in backend.received] == ["/actions"]  # nothing sent to the Location


def _readme_verifier() -> Callable[..., bool]:
    """The verification example docs/business-backend.md gives receivers, run as written there."""
    blocks = re.findall(r"```python\n(.*?)```", BACKEND_DOC.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if "webhook-signature" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, "business-backend.md", "exec"), namespace)
    verified: Callable[..., bool] = namespace["verified"]
    return verified


def test_every_delivery_is_signed_over_its_id_send_time_and_body_as_the_readme_verifies(
    rt: Runtime, tmp_path: Path, backend: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    verified = _readme_verifier()
    task_id, action_id = approved_action(rt, tmp_path)
    dispatcher = OutboxDispatcher(rt.settings, rt.db)
    sent_at = int(time.time())
    try:
        with caplog.at_level(logging.DEBUG):
            assert len(dispatcher.run_once().delivered) == 4
    finally:
        dispatcher.close()
    [action] = backend.on("/actions")
    hooks = backend.on("/hooks")
    assert action.headers["webhook-id"] == action_id  # the id a receiver deduplicates on
    assert [h.headers["webhook-id"] for h in hooks] == [f"{task_id}:{n}" for n in (3, 4, 5)]
    for request, secret in [(action, ACTIONS_SECRET), *((h, SECRET) for h in hooks)]:
        headers = request.headers
        assert sent_at <= int(headers["webhook-timestamp"]) <= time.time()
        assert verified(request.raw, headers, secret)
        other = ACTIONS_SECRET if secret == SECRET else SECRET
        assert not verified(request.raw, headers, other)
        assert not verified(request.raw.replace(b"}", b" }", 1), headers, secret)
        # Replayed with a new time (the old one is too old) or another id: refused.
        later = str(int(headers["webhook-timestamp"]) + 1)
        assert not verified(request.raw, {**headers, "webhook-timestamp": later}, secret)
        assert not verified(request.raw, {**headers, "webhook-id": "t:99"}, secret)
        assert not verified(request.raw, {**headers, "webhook-timestamp": "1"}, secret)
        assert headers["x-orchestrator-signature"].startswith("sha256=")  # today's receivers
    # The same request captured and sent ten minutes on is refused by the documented check.
    replay_at = time.time() + 600
    with pytest.MonkeyPatch.context() as later_on:
        later_on.setattr(time, "time", lambda: replay_at)
        assert not verified(action.raw, action.headers, ACTIONS_SECRET)
    assert not any(s in caplog.text for s in (SECRET, ACTIONS_SECRET))


def test_a_timeout_says_how_long_it_waited_and_which_setting_that_is(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """A backend slower than the timeout (one that may well take each request) read `timed
    out`: the error names ORCH_OUTBOX_TIMEOUT_SECONDS and its value, the setting to raise."""
    task_id, _ = approved_action(rt, tmp_path)
    backend.delay_seconds = 5.0  # held until released: longer than the timeout below
    settings = rt.settings.model_copy(update={"webhook_url": None, "outbox_timeout_seconds": 0.3})
    dispatcher = OutboxDispatcher(settings, rt.db)
    try:
        report = dispatcher.run_once()
    finally:
        backend.release.set()
        dispatcher.close()
    row = action_row(rt, task_id)
    assert report.failed == [row.outbox_id]
    assert row.last_error == "timed out: no answer within ORCH_OUTBOX_TIMEOUT_SECONDS (0.3 s)"


def test_a_backend_that_stops_reading_the_request_is_said_to_have_stopped_not_to_be_slow(
    rt: Runtime, tmp_path: Path
) -> None:
    """A write timeout (the backend, or a proxy before it, took no more of the request) read
    "no answer within ORCH_OUTBOX_TIMEOUT_SECONDS", as if the backend were slow to answer a
    request it never had whole. A real listener that accepts and never reads, a body larger
    than the loopback's buffers."""
    task_id, _ = approved_action(rt, tmp_path)
    with rt.db.transaction() as conn:  # larger than what the socket buffers hold (4 MB each)
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "action")
            .values(body='{"pad": "' + "x" * (24 << 20) + '"}')
        )
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    taker = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    taker.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/actions"
    settings = rt.settings.model_copy(
        update={"webhook_url": None, "actions_url": url, "outbox_timeout_seconds": 0.3}
    )
    dispatcher = OutboxDispatcher(settings, rt.db)
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
        taker.join(5)
        for conn_ in accepted:
            conn_.close()
        listener.close()
    row = action_row(rt, task_id)
    assert report.failed == [row.outbox_id]
    assert row.last_error == (
        "timed out sending: the backend took no more of the request within "
        "ORCH_OUTBOX_TIMEOUT_SECONDS (0.3 s)"
    )


def test_a_send_that_found_no_free_connection_says_nothing_was_sent(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """A pool timeout (every connection of the client busy with another send) is not the
    backend's slowness: nothing was sent. The dispatcher's client shared, its one connection
    held by a request the backend has not answered."""
    task_id, _ = approved_action(rt, tmp_path)
    backend.delay_seconds, backend.slow_path = 5.0, "/held"
    client = httpx.Client(
        timeout=httpx.Timeout(0.3, read=5.0), limits=httpx.Limits(max_connections=1)
    )
    settings = rt.settings.model_copy(update={"webhook_url": None, "outbox_timeout_seconds": 0.3})
    holder = threading.Thread(target=client.post, args=(f"{backend.url}/held",), daemon=True)
    holder.start()
    assert backend.arrived.wait(5)
    dispatcher = OutboxDispatcher(settings, rt.db, client=client)
    try:
        report = dispatcher.run_once()
    finally:
        backend.release.set()
        holder.join(5)
        client.close()
    row = action_row(rt, task_id)
    assert report.failed == [row.outbox_id]
    assert row.last_error == (
        "timed out waiting for a free connection (nothing sent) within "
        "ORCH_OUTBOX_TIMEOUT_SECONDS (0.3 s)"
    )
