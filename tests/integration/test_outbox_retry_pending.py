"""An operator's retry of a pending delivery: failing and backing off, it is due now.

Before, only a dead letter could be retried: once the backend was mended, a webhook that had
failed against it waited out its backoff (up to ORCH_OUTBOX_BACKOFF_MAX_SECONDS) and held its
task's later events behind it. A pending row a dispatcher is sending is pending too: a retry
of it is refused (`409 being_sent`), never made due for a second dispatcher to send it at the
same time; one held in order behind an earlier event names that one (`409 waits_behind`).

Both stores (and a retry racing a claim on Postgres), a real HTTP backend on loopback, the
API's route and the CLI.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.errors import ConflictError
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import DispatchReport
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store import outbox_sending
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.types import utcnow
from tests.outbox_support import (
    Recorder,
    cli_on,
    outbox_runtime,
    running_recorder,
    slow_dispatcher,
    until_a_statement_waits_for_a_lock,
    waiting_task,
)


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


def _webhooks(rt: Runtime, task_id: str) -> list[OutboxRow]:
    return [r for r in OutboxService(rt.db).list(task_id=task_id) if r.kind == "webhook"]


def test_a_failing_pending_delivery_is_due_now_once_the_backend_is_mended(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    dispatcher = slow_dispatcher(rt)
    try:
        backend.always_fail = True
        assert dispatcher.run_once().failed  # the task's first webhook; the next waits
        first, second = _webhooks(rt, task_id)[:2]
        assert (first.status, first.attempts, first.last_error) == ("pending", 1, "HTTP 503")
        assert (first.next_attempt_at - utcnow()).total_seconds() > 60  # backing off
        backend.always_fail = False  # the backend is mended: nothing goes out before the backoff
        assert dispatcher.run_once().sent == 0

        cli_on(monkeypatch, store_url, tmp_path)
        # The one behind it is not hurried in its place: it names the one to retry.
        assert main(["outbox", "retry", str(second.outbox_id)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"orchestrator: waits_behind: outbox row {second.outbox_id} ")
        assert f"waits behind outbox {first.outbox_id}, an earlier event being retried" in err
        assert main(["outbox", "retry", str(first.outbox_id)]) == 0
        assert capsys.readouterr().out == (
            f"outbox {first.outbox_id} is due again (task {task_id})\n"
        )
        hurried = OutboxService(rt.db).list(task_id=task_id)[0]
        assert hurried.next_attempt_at <= utcnow()
        # Counts kept: it is not dead, and its failures still count toward the limit.
        assert (hurried.status, hurried.attempts, hurried.last_error) == ("pending", 1, "HTTP 503")
        report = dispatcher.run_once()
        assert report.delivered[:2] == [first.outbox_id, second.outbox_id]
        # A delivered one is not retried (nor hurried): said as before.
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            again = client.post(f"/api/v1/outbox/{first.outbox_id}/retry")
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "invalid_transition"
        assert again.json()["error"]["message"].endswith(
            "is delivered; only a dead or pending one can be retried"
        )
    finally:
        dispatcher.close()
    assert [h.body["seq"] for h in backend.on("/hooks")][:3] == [3, 3, 4]


def test_a_delivery_being_sent_is_not_retried_nor_sent_twice_at_once(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dispatcher sending a row holds it pending with its hold in `next_attempt_at`: a retry
    made due then would have a second dispatcher send it while the first waits for its
    answer. It is refused, and takes once that attempt's answer is recorded."""
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    first, second = slow_dispatcher(rt), slow_dispatcher(rt)
    reports: list[DispatchReport] = []
    sending = threading.Thread(target=lambda: reports.append(first.run_once()))
    try:
        backend.always_fail = True
        backend.delay_seconds, backend.slow_path = 30.0, "/hooks"  # held until `release`
        sending.start()
        assert backend.arrived.wait(10)  # the first webhook is with the backend
        [row] = [r for r in _webhooks(rt, task_id) if r.attempts]
        assert row.being_sent(utcnow())

        with pytest.raises(ConflictError) as refused:
            OutboxService(rt.db).retry(row.outbox_id, by="ops")
        assert refused.value.code == "being_sent"
        assert f"outbox row {row.outbox_id} is being sent now (attempt 1, held until " in str(
            refused.value
        )
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            answer = client.post(f"/api/v1/outbox/{row.outbox_id}/retry")
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "being_sent"
            shown = client.get(f"/api/v1/outbox/{row.outbox_id}").json()
            assert shown["claimed_until"] is not None
        cli_on(monkeypatch, store_url, tmp_path)
        assert main(["outbox", "retry", str(row.outbox_id)]) == 1
        assert capsys.readouterr().err.startswith(
            f"orchestrator: being_sent: outbox row {row.outbox_id} is being sent now"
        )
        assert main(["outbox", "show", str(row.outbox_id)]) == 0
        assert "  being sent now (attempt 1, held until " in capsys.readouterr().out
        assert main(["outbox", "list", "--task", task_id]) == 0
        assert "  being sent now" in capsys.readouterr().out.splitlines()[0]
        assert second.run_once().sent == 0  # not due: the other dispatcher's to send

        backend.release.set()  # the attempt ends, failed (503), and is recorded
        sending.join(10)
        assert reports[0].failed == [row.outbox_id]
        recorded = OutboxService(rt.db).list(task_id=task_id)[0]
        assert recorded.claimed_until is None
        assert not recorded.being_sent(utcnow())
        backend.always_fail = False
        assert (
            OutboxService(rt.db).retry(row.outbox_id, by="ops").attempts == 1
        )  # due now, counts kept
        assert second.run_once().delivered[0] == row.outbox_id
    finally:
        backend.release.set()
        sending.join(10)
        first.close()
        second.close()
    assert [h.body["seq"] for h in backend.on("/hooks")][:2] == [3, 3]  # one send at a time


def test_a_retry_racing_a_claim_waits_for_it_and_finds_the_row_being_sent(
    pg_url: str, tmp_path: Path, backend: Recorder
) -> None:
    """On Postgres a claim locks its rows until it commits: a retry of the row meanwhile waits
    for that commit, then finds the row claimed and is refused. Made due after the claim's
    read, the row would be due for another dispatcher while this one sends it."""
    with outbox_runtime(
        pg_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as rt:
        task_id, _ = waiting_task(rt, tmp_path)
        failures: list[BaseException] = []

        def retry(outbox_id: int) -> None:
            try:
                OutboxService(rt.db).retry(outbox_id, by="ops")
            except BaseException as exc:  # read in the main thread
                failures.append(exc)

        with rt.db.transaction() as conn:
            [claimed] = outbox_sending.claim_due(conn, ("webhook",), limit=1, hold_seconds=60)
            racing = threading.Thread(target=retry, args=(claimed.outbox_id,))
            racing.start()
            until_a_statement_waits_for_a_lock(rt)
        racing.join(10)
        assert not racing.is_alive()
        [failure] = failures
        assert isinstance(failure, ConflictError)
        assert failure.code == "being_sent"
        [row] = [r for r in _webhooks(rt, task_id) if r.outbox_id == claimed.outbox_id]
        assert row.next_attempt_at == claimed.next_attempt_at  # still the claim's hold


def test_every_failing_delivery_is_due_now_after_an_outage_but_the_one_being_sent(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An outage of the backend fails a webhook of each task: once it is mended, they are made
    due at once (`outbox retry --all-failing`, `POST /api/v1/outbox/retry-failing`), not one
    retry per row; one a dispatcher is sending is left to it, and said."""
    from orchestrator.cli import main

    tasks = [waiting_task(rt, tmp_path)[0] for _ in range(3)]
    first, second = slow_dispatcher(rt), slow_dispatcher(rt)
    sending = threading.Thread(target=first.run_once)
    try:
        backend.always_fail = True
        assert len(first.run_once().failed) == 3  # each task's first webhook, backing off
        cli_on(monkeypatch, store_url, tmp_path)
        [held, *rest] = [_webhooks(rt, task_id)[0] for task_id in tasks]
        OutboxService(rt.db).retry(held.outbox_id, by="ops")  # due now: the dispatcher takes it
        backend.delay_seconds, backend.slow_path = 30.0, "/hooks"
        backend.arrived.clear()
        sending.start()
        assert backend.arrived.wait(10)
        assert main(["outbox", "retry", "--all-failing", "--kind", "action"]) == 0
        assert capsys.readouterr().out == "0 failing deliveries are due now\n"
        assert main(["outbox", "retry", "--all-failing", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"retried": 2, "being_sent": 1}
        for row in rest:
            hurried = _webhooks(rt, row.task_id)[0]
            assert hurried.next_attempt_at <= utcnow()
            assert (hurried.attempts, hurried.status) == (1, "pending")  # counts kept
        assert main(["outbox", "retry", "--all-failing"]) == 0  # the two are due already
        assert capsys.readouterr().out == (
            "0 failing deliveries are due now; 1 being sent was left to the dispatcher (retry "
            "once the answer is recorded, if it failed again)\n"
        )
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            answer = client.post("/api/v1/outbox/retry-failing", json={"task_id": tasks[0]})
            assert answer.json() == {"retried": 0, "being_sent": 1}
            unknown = client.post("/api/v1/outbox/retry-failing", json={"task_id": "nope"})
            assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
        for wrong in (["outbox", "retry", "--all-dead", "--all-failing"], ["outbox", "retry"]):
            assert main(wrong) == 2
            assert "give one OUTBOX_ID, or --all-dead, or --all-failing" in capsys.readouterr().err
        backend.release.set()  # the held attempt ends (failed), and the backend is mended
        sending.join(10)
        backend.always_fail = False
        assert second.run_once().delivered[:2] == [r.outbox_id for r in rest]
    finally:
        backend.release.set()
        sending.join(10)
        first.close()
        second.close()
