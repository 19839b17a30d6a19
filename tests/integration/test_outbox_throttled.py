"""A business backend that rate-limits us (HTTP 429) is saying "later", not failing.

A webhook answered 429 backs off as before (`Retry-After` honoured) but the attempt does not
count toward ORCH_WEBHOOK_MAX_ATTEMPTS (3 here): a burst throttled for longer than the limit
no longer dead-letters the event and stops its task's stream. 5xx answers still count, and an
operator's retry starts both counts afresh. Both stores, a real HTTP backend on loopback; each
round is one attempt, made due by the test (no waiting out the backoff).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store import outbox_sending
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task

SECRET = "webhook-secret-for-throttling"
ACTIONS_SECRET = "actions-secret-for-throttling"
NOT_COUNTED = "HTTP 429 (throttled: not counted toward ORCH_WEBHOOK_MAX_ATTEMPTS)"


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url, tmp_path, backend, webhook_secret=SECRET, actions_secret=ACTIONS_SECRET
    ) as runtime:
        assert runtime.settings.webhook_max_attempts == 3
        yield runtime


@pytest.fixture
def dispatcher(rt: Runtime) -> Iterator[OutboxDispatcher]:
    sender = OutboxDispatcher(rt.settings, rt.db)
    yield sender
    sender.close()


def first_hook(rt: Runtime, task_id: str) -> OutboxRow:
    """The task's first webhook (event 3; event 4 waits behind it)."""
    rows = OutboxService(rt.db).list(task_id=task_id, kind="webhook")
    assert [row.event_seq for row in rows] == [3, 4]
    return rows[0]


def due_now(rt: Runtime) -> None:
    """The next attempt now, instead of after the backoff (which each test checks first)."""
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox).where(outbox.c.status == "pending").values(next_attempt_at=utcnow())
        )


def counter(name: str) -> float:
    """This process's `orchestrator_outbox_<name>_total`."""
    value = REGISTRY.get_sample_value(f"orchestrator_outbox_{name}_total")
    assert value is not None, name
    return value


def rounds(rt: Runtime, dispatcher: OutboxDispatcher, task_id: str, n: int) -> list[str]:
    """`n` rounds, one attempt each: the first webhook's status after each."""
    statuses = []
    for _ in range(n):
        due_now(rt)
        dispatcher.run_once()
        statuses.append(first_hook(rt, task_id).status)
    return statuses


def test_a_webhook_throttled_past_the_limit_stays_pending_and_is_delivered_in_order(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail, backend.fail_status = True, 429
    backend.fail_headers = {"Retry-After": "60"}
    throttled_before, failures_before = counter("throttled"), counter("failures")
    # Seven 429s, more than twice ORCH_WEBHOOK_MAX_ATTEMPTS: it used to be dead at the third.
    for attempt in range(1, 8):
        before = utcnow()
        report = dispatcher.run_once()
        hook = first_hook(rt, task_id)
        assert report.throttled == [hook.outbox_id]
        assert (report.failed, report.dead) == ([], [])
        assert (hook.status, hook.attempts, hook.throttled) == ("pending", attempt, attempt)
        assert hook.last_error == NOT_COUNTED
        # It still backs off: the backend's Retry-After, not at once.
        assert hook.next_attempt_at >= before + timedelta(seconds=59)
        due_now(rt)
    # A dashboard tells the throttling from failures.
    assert (counter("throttled") - throttled_before, counter("failures")) == (7, failures_before)

    # Operators see it: the API, `outbox list` and `tasks show` give the throttled count.
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        [item, _] = client.get("/api/v1/outbox", params={"task_id": task_id}).json()["items"]
        assert (item["attempts"], item["throttled"], item["last_error"]) == (7, 7, NOT_COUNTED)
    from orchestrator.cli import main

    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    assert main(["outbox", "list", "--task", task_id]) == 0
    assert "attempts 7    throttled 7    task" in capsys.readouterr().out.splitlines()[0]
    assert main(["tasks", "show", task_id]) == 0
    assert f"attempts 7 (throttled 7), last error: {NOT_COUNTED}" in capsys.readouterr().out

    # The backend takes it: delivered, then the task's next event, in that order.
    backend.always_fail = False
    assert len(dispatcher.run_once().delivered) == 2
    assert [h.body["seq"] for h in backend.on("/hooks")] == [3] * 8 + [4]
    rows = OutboxService(rt.db).list(task_id=task_id)
    assert [(r.event_seq, r.status, r.throttled) for r in rows] == [
        (3, "delivered", 7),
        (4, "delivered", 0),
    ]


@pytest.mark.parametrize(
    ("answers", "dead_after"),
    [
        ([503, 503, 503], 3),  # 5xx still count: dead at ORCH_WEBHOOK_MAX_ATTEMPTS
        ([429, 503, 429, 429, 503, 429, 503], 7),  # only when the 5xx alone reach it
        ([408, 429, 500, 429, 429, 502], 6),  # a retryable 4xx counts as a 5xx does
    ],
)
def test_only_the_attempts_that_were_not_throttled_dead_letter_a_webhook(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    answers: list[int],
    dead_after: int,
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    backend.answers = list(answers)
    statuses = rounds(rt, dispatcher, task_id, len(answers))
    assert statuses == ["pending"] * (dead_after - 1) + ["dead"]
    dead = first_hook(rt, task_id)
    throttled = answers.count(429)
    assert (dead.attempts, dead.throttled) == (len(answers), throttled)
    assert dead.last_error == f"HTTP {answers[-1]}"
    assert [h.body["seq"] for h in backend.on("/hooks")] == [3] * len(answers)  # 4 waits


def test_an_operator_retry_gives_a_throttled_dead_webhook_its_whole_budget_again(
    rt: Runtime, tmp_path: Path, backend: Recorder, dispatcher: OutboxDispatcher
) -> None:
    task_id, _ = waiting_task(rt, tmp_path)
    backend.answers = [429, 429, 429, 429, 503, 503, 503]
    assert rounds(rt, dispatcher, task_id, 7)[-1] == "dead"
    dead = first_hook(rt, task_id)
    assert (dead.attempts, dead.throttled) == (7, 4)
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        retried = client.post(f"/api/v1/outbox/{dead.outbox_id}/retry").json()
    assert (retried["status"], retried["attempts"], retried["throttled"]) == ("pending", 0, 0)
    # Both counts afresh: the old throttled four would otherwise lend it four more failures.
    backend.answers = [503, 503, 503]
    assert rounds(rt, dispatcher, task_id, 3) == ["pending", "pending", "dead"]
    assert (first_hook(rt, task_id).attempts, first_hook(rt, task_id).throttled) == (3, 0)


def test_a_throttled_answer_of_a_claim_taken_over_is_not_recorded(
    rt: Runtime, tmp_path: Path
) -> None:
    """The throttled count moves in the claim's compare-and-set: a dispatcher whose hold ran
    out and whose row another claimed records nothing, not even the 429."""
    task_id, _ = waiting_task(rt, tmp_path)
    with rt.db.transaction() as conn:
        [stale] = outbox_sending.claim_due(conn, ("webhook",), limit=1, hold_seconds=0)
    with rt.db.transaction() as conn:
        [current] = outbox_sending.claim_due(conn, ("webhook",), limit=1, hold_seconds=60)
    assert (stale.outbox_id, stale.attempts, current.attempts) == (current.outbox_id, 1, 2)
    with rt.db.transaction() as conn:
        assert not outbox_sending.mark_failed(
            conn, stale, NOT_COUNTED, retry_at=utcnow(), dead=False, throttled=True
        )
        assert outbox_sending.mark_failed(
            conn, current, NOT_COUNTED, retry_at=utcnow(), dead=False, throttled=True
        )
    hook = first_hook(rt, task_id)
    assert (hook.attempts, hook.throttled, hook.counted) == (2, 1, 1)
