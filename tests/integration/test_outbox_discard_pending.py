"""An operator's discard of a pending delivery: failing, and no dispatcher sending it.

An approved action is retried until a 2xx, so one the backend answers 500 for every time (a
bug on its side for that one payload) was sent for ever, and `outbox discard` said only a dead
row can be discarded. A pending row no dispatcher is sending is discarded now, with who, when
and why; one being sent is refused (`409 being_sent`: its answer may yet deliver it), and a
dispatcher that claims after the discard (or while it is written, on Postgres) never sends it.

Both stores (and the races on Postgres), a real HTTP backend on loopback, the API's route and
the CLI.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.errors import ConflictError
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import DispatchReport
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store import outbox_operator, outbox_sending, outbox_views
from orchestrator.store.outbox import OutboxRow
from tests.outbox_support import (
    Recorder,
    approved_action,
    cli_on,
    outbox_runtime,
    running_recorder,
    slow_dispatcher,
    until_a_statement_waits_for_a_lock,
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


def _delivery(rt: Runtime, action_id: str) -> OutboxRow:
    with rt.db.transaction(readonly=True) as conn:
        row = outbox_views.action_delivery(conn, action_id)
    assert row is not None
    return row


def test_a_failing_approved_action_is_discarded_and_never_sent_again(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    _, action_id = approved_action(rt, tmp_path)
    dispatcher = slow_dispatcher(rt)
    try:
        backend.always_fail, backend.fail_status = True, 500  # the backend's bug, every time
        dispatcher.run_once()
        row = _delivery(rt, action_id)
        assert (row.status, row.attempts, row.last_error) == ("pending", 1, "HTTP 500")
        number = row.outbox_id

        cli_on(monkeypatch, store_url, tmp_path)
        assert main(["outbox", "show", str(number)]) == 0
        assert f"`orchestrator outbox discard {number} --reason R`" in capsys.readouterr().out
        # Where the action shows its delivery, the ways out of a failing one are named.
        assert main(["actions", "show", action_id]) == 0
        [line] = [x for x in capsys.readouterr().out.splitlines() if "delivery:" in x]
        assert line.endswith(
            f"(outbox {number}): `orchestrator outbox retry {number}` sends it now once the "
            f"backend is mended, or `outbox discard {number} --reason R` once dealt with by hand"
        )
        assert main(["actions", "list", "--status", "approved"]) == 0
        assert (
            capsys.readouterr()
            .out.splitlines()[0]
            .endswith(
                f"delivery pending after 1 attempt(s): outbox retry {number} or discard it "
                f"(outbox {number})"
            )
        )
        assert (
            main(["outbox", "discard", str(number), "--reason", "done by phone", "--by", "kim"])
            == 0
        )
        assert capsys.readouterr().out == (
            f"outbox {number} discarded by kim: approved action {action_id} is not sent\n"
        )
        assert main(["outbox", "show", str(number), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["status"], shown["discarded_by"], shown["discard_reason"]) == (
            "discarded",
            "kim",
            "done by phone",
        )
        assert shown["discarded_from"] == "pending"
        assert shown["discarded_at"] is not None
        assert shown["dead_reason"] is None  # never dead-lettered: it failed, and was settled
        assert main(["outbox", "show", str(number)]) == 0
        assert "(it was pending, not dead-lettered): done by phone" in capsys.readouterr().out

        backend.always_fail = False  # mended: still not sent, it was settled by hand
        OutboxService(rt.db).retry_failing(by="kim")  # every failing one due now, but it
        assert number not in dispatcher.run_once().delivered
        assert len(backend.on("/actions")) == 1  # the one failed attempt, no more
        assert _delivery(rt, action_id).status == "discarded"
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            again = client.post(
                f"/api/v1/outbox/{number}/discard", json={"reason": "again", "by": "kim"}
            )
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "invalid_transition"
        assert again.json()["error"]["message"].endswith(
            "is discarded; only a dead or pending one can be discarded"
        )
    finally:
        dispatcher.close()


def test_a_delivery_being_sent_is_not_discarded(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its answer may yet deliver it: the discard is refused, and takes once the attempt's
    answer (a failure) is recorded."""
    from orchestrator.cli import main

    _, action_id = approved_action(rt, tmp_path)
    dispatcher = slow_dispatcher(rt)
    reports: list[DispatchReport] = []
    sending = threading.Thread(target=lambda: reports.append(dispatcher.run_once()))
    try:
        backend.always_fail, backend.fail_status = True, 500
        backend.delay_seconds, backend.slow_path = 30.0, "/actions"  # held until `release`
        sending.start()
        assert backend.arrived.wait(10)
        while not backend.on("/actions"):  # the webhooks of the batch may go first
            backend.arrived.clear()
            if not backend.on("/actions"):  # arrived since: set after the clear
                assert backend.arrived.wait(10)
        number = _delivery(rt, action_id).outbox_id

        with pytest.raises(ConflictError) as refused:
            OutboxService(rt.db).discard(number, reason="x", by="kim")
        assert refused.value.code == "being_sent"
        assert str(refused.value).endswith("discard it then if it failed")
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            answer = client.post(
                f"/api/v1/outbox/{number}/discard", json={"reason": "x", "by": "k"}
            )
        assert (answer.status_code, answer.json()["error"]["code"]) == (409, "being_sent")
        cli_on(monkeypatch, store_url, tmp_path)
        assert main(["outbox", "discard", str(number), "--reason", "x"]) == 1
        assert capsys.readouterr().err.startswith(
            f"orchestrator: being_sent: outbox row {number} is being sent now (attempt 1, held "
        )
        assert _delivery(rt, action_id).status == "pending"
        assert main(["actions", "show", action_id]) == 0
        [line] = [x for x in capsys.readouterr().out.splitlines() if "delivery:" in x]
        assert ", being sent now (attempt 1, held until " in line
        assert "outbox retry" not in line  # refused while it is sent

        backend.release.set()
        sending.join(10)
        assert number in reports[0].failed
        assert OutboxService(rt.db).discard(number, reason="x", by="kim").status == "discarded"
    finally:
        backend.release.set()
        sending.join(10)
        dispatcher.close()


def test_a_discard_racing_a_claim_on_postgres(
    pg_url: str, tmp_path: Path, backend: Recorder
) -> None:
    """A claim being written holds the row's lock: a discard meanwhile waits, then finds the
    row claimed in a batch and not posted, and settles it; the dispatcher's compare-and-set
    before the post (`start_send`) then fails, and nothing is sent (the discard was refused
    `being_sent` before, though the row had not been sent). A post being recorded holds the
    lock too: a discard meanwhile waits, then finds the row posted, and is refused. A discard
    being written holds it as well: a dispatcher's claim meanwhile skips the row, and one after
    its commit finds it discarded; it is never sent."""
    with outbox_runtime(
        pg_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as rt:
        _, first_action = approved_action(rt, tmp_path)
        failures: list[BaseException] = []

        def discard(outbox_id: int) -> None:
            try:
                OutboxService(rt.db).discard(outbox_id, reason="x", by="kim")
            except BaseException as exc:  # read in the main thread
                failures.append(exc)

        with rt.db.transaction() as conn:
            [claimed] = outbox_sending.claim_due(conn, ("action",), limit=1, hold_seconds=60)
            racing = threading.Thread(target=discard, args=(claimed.outbox_id,))
            racing.start()
            until_a_statement_waits_for_a_lock(rt)
        racing.join(10)
        assert not racing.is_alive()
        assert failures == []
        row = _delivery(rt, first_action)
        assert (row.status, row.discarded_from) == ("discarded", "pending")
        assert row.attempts == 0  # the claim it met unposted counts no attempt
        with rt.db.transaction() as conn:  # its turn in the batch comes: not posted
            assert not outbox_sending.start_send(conn, claimed, hold_seconds=60)

        _, second_action = approved_action(rt, tmp_path)
        with rt.db.transaction() as conn:
            [second] = outbox_sending.claim_due(conn, ("action",), limit=1, hold_seconds=60)
        with rt.db.transaction() as conn:  # its turn: posted (the post itself is left out)
            assert outbox_sending.start_send(conn, second, hold_seconds=60)
            racing = threading.Thread(target=discard, args=(second.outbox_id,))
            racing.start()
            until_a_statement_waits_for_a_lock(rt)
        racing.join(10)
        assert not racing.is_alive()
        [failure] = failures
        assert isinstance(failure, ConflictError)
        assert failure.code == "being_sent"
        assert f"outbox row {second.outbox_id} is being sent now (attempt 1" in str(failure)
        assert _delivery(rt, second_action).status == "pending"

        with rt.db.transaction() as conn:  # the claim's answer: failed, due again now
            assert outbox_sending.mark_failed(
                conn, second, "HTTP 500", retry_at=second.created_at, dead=False
            )
        dispatcher = slow_dispatcher(rt)
        try:
            reports: list[DispatchReport] = []
            with rt.db.transaction() as conn:
                assert outbox_operator.discard(conn, second.outbox_id, by="kim", reason="by phone")
                # Not committed yet: a dispatcher's round meanwhile skips the locked row.
                claiming = threading.Thread(target=lambda: reports.append(dispatcher.run_once()))
                claiming.start()
                claiming.join(10)
                assert not claiming.is_alive()
            reports.append(dispatcher.run_once())  # after the commit: discarded, not due
        finally:
            dispatcher.close()
        assert all(second.outbox_id not in r.delivered + r.failed for r in reports)
        assert backend.on("/actions") == []
        row = _delivery(rt, second_action)
        assert (row.status, row.discarded_from, row.attempts) == ("discarded", "pending", 1)


def test_a_claim_whose_hold_ran_out_is_discarded_and_then_not_sent(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """A row claimed in a batch waits for the rows before it; once its hold ran out it is no
    longer being sent, and an operator may discard it: the claim's renewal before the send
    then fails, so the dispatcher skips it, and its answer (had it sent) records nothing."""
    _, action_id = approved_action(rt, tmp_path)
    with rt.db.transaction() as conn:
        [claimed] = outbox_sending.claim_due(conn, ("action",), limit=1, hold_seconds=0)
    assert OutboxService(rt.db).discard(claimed.outbox_id, reason="x", by="kim").status == (
        "discarded"
    )
    with rt.db.transaction() as conn:
        assert not outbox_sending.renew_claim(conn, claimed, hold_seconds=60)
        assert not outbox_sending.mark_failed(
            conn, claimed, "HTTP 500", retry_at=claimed.created_at, dead=False
        )
    row = _delivery(rt, action_id)
    assert (row.status, row.discarded_from, row.claimed_until) == ("discarded", "pending", None)
    assert row.attempts == 0  # its dispatcher never posted it
    assert backend.on("/actions") == []


def test_tasks_show_names_the_ways_out_of_a_failing_delivery(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tasks show` listed a failing approved action as its attempts and last error only, as if
    waiting were all an operator could do: it names `outbox retry N` and `outbox discard N
    --reason R` as `actions show` does, and says "being sent now" (no commands) for one a
    dispatcher holds."""
    from sqlalchemy import update

    from orchestrator.cli import main
    from orchestrator.store.tables import outbox
    from orchestrator.store.types import utcnow

    task_id, action_id = approved_action(rt, tmp_path)
    dispatcher = slow_dispatcher(rt)
    try:
        backend.always_fail, backend.fail_status = True, 500
        dispatcher.run_once()
    finally:
        dispatcher.close()
    number = _delivery(rt, action_id).outbox_id
    cli_on(monkeypatch, store_url, tmp_path)

    def line() -> str:
        assert main(["tasks", "show", task_id]) == 0
        [shown] = [x for x in capsys.readouterr().out.splitlines() if f"outbox {number} " in x]
        return shown

    failing = line()
    assert "attempts 1 (throttled 0), last error: HTTP 500; next attempt at " in failing
    assert failing.endswith(ways_out_of(number))
    assert main(["outbox", "retry", str(number), "--by", "kim", "--note", "mended"]) == 0
    capsys.readouterr()
    assert "; retried by kim at " in line()  # due now, and who made it so
    assert line().endswith(": mended")  # after its last error
    with rt.db.transaction() as conn:  # failed again, backing off; then a dispatcher's claim,
        # as it holds the row mid-send
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == number)
            .values(next_attempt_at=utcnow() + timedelta(minutes=5))
        )
    assert line().endswith(ways_out_of(number))
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == number)
            .values(claimed_until=utcnow() + timedelta(minutes=5))
        )
    waiting = line()  # claimed in a dispatcher's batch, not posted yet
    assert "; claimed by a dispatcher, waiting its turn in its batch (held until " in waiting
    assert "outbox retry" not in waiting
    with rt.db.transaction() as conn:  # posted
        conn.execute(
            update(outbox).where(outbox.c.outbox_id == number).values(sending_since=utcnow())
        )
    sending = line()
    assert "; being sent now (held until " in sending
    assert "outbox retry" not in sending
    assert "outbox discard" not in sending
    with rt.db.transaction() as conn:  # its answer refused it for good: a dead letter
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == number)
            .values(status="dead", claimed_until=None)
        )
    assert line().endswith(
        f"; `orchestrator outbox retry {number}` once the backend is mended, "
        f"or `outbox discard {number} --reason R`"
    )


def ways_out_of(number: int) -> str:
    return (
        f": `orchestrator outbox retry {number}` sends it now once the backend is mended, "
        f"or `outbox discard {number} --reason R` once dealt with by hand"
    )


def test_a_send_answered_2xx_after_its_discard_is_recorded_as_delivered_after_it(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A send's hold ran out while the backend still worked on it (its renewals failed: the
    store away a moment), so an operator could discard the row; then the backend answered 200.
    The backend did act: the row is delivered, and still says who discarded it, when and why.
    Before, `outbox show` said `delivered T` alone, and the discard (the operator was told
    "approved action A is not sent") was hidden; nothing was logged."""
    from sqlalchemy import update

    from orchestrator.cli import main
    from orchestrator.store.tables import outbox
    from orchestrator.store.types import utcnow

    _, action_id = approved_action(rt, tmp_path)
    dispatcher = slow_dispatcher(rt)
    reports: list[DispatchReport] = []
    sending = threading.Thread(target=lambda: reports.append(dispatcher.run_once()))
    try:
        backend.delay_seconds, backend.slow_path = 30.0, "/actions"  # answered on `release`
        sending.start()
        assert backend.arrived.wait(10)
        while not backend.on("/actions"):  # the webhooks of the batch may go first
            backend.arrived.clear()
            if not backend.on("/actions"):
                assert backend.arrived.wait(10)
        number = _delivery(rt, action_id).outbox_id
        with rt.db.transaction() as conn:  # the hold ran out mid-send
            conn.execute(
                update(outbox)
                .where(outbox.c.outbox_id == number)
                .values(claimed_until=utcnow() - timedelta(seconds=1))
            )
        cli_on(monkeypatch, store_url, tmp_path)
        discard = ["outbox", "discard", str(number), "--reason", "done by phone", "--by", "kim"]
        assert main(discard) == 0
        capsys.readouterr()

        caplog.set_level("INFO", logger="orchestrator.services.outbox")
        backend.release.set()  # the backend answers 200: it took the work order
        sending.join(10)
        assert number in reports[0].delivered
    finally:
        backend.release.set()
        sending.join(10)
        dispatcher.close()

    row = _delivery(rt, action_id)
    assert (row.status, row.discarded_by, row.discard_reason) == (
        "delivered",
        "kim",
        "done by phone",
    )
    assert row.delivered_at is not None
    assert row.discarded_at is not None
    assert row.discarded_at <= row.delivered_at
    [warned] = [r.getMessage() for r in caplog.records if "after" in r.getMessage()]
    assert warned.startswith(f"outbox {number} (action of task ")
    assert warned.endswith(
        "was discarded by 'kim' while a send was under way, and the backend answered it 2xx: "
        "delivered after the discard (the backend did act on it)"
    )

    assert main(["outbox", "show", str(number)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith(f"outbox {number}  delivered  approved action {action_id}")
    [delivered] = [x for x in shown if x.startswith("  delivered ")]
    assert delivered.endswith(
        ", after its discard: the send under way then was answered 2xx (the backend did act on it)"
    )
    [discarded] = [x for x in shown if x.startswith("  discarded by ")]
    assert discarded.endswith("(it was pending, not dead-lettered): done by phone")
    assert main(["outbox", "list", "--task", row.task_id]) == 0
    [listed] = [
        x for x in capsys.readouterr().out.splitlines() if x.lstrip().startswith(str(number))
    ]
    assert "delivered" in listed
    assert listed.endswith("  delivered after its discard by kim: done by phone")
    assert main(["actions", "show", action_id]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if "delivery:" in x]
    assert line.endswith(
        f"(outbox {number}), after its discard by kim at "
        f"{row.discarded_at.isoformat(timespec='seconds')}: done by phone"
    )
