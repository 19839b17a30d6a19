"""Retention of the outbox's webhooks: delivered ones and those nobody sends go after
ORCH_RETENTION_DAYS; dead letters, retrying rows and approved actions stay. Whether anybody
sends them is read from the store (were any delivered, dead-lettered or discarded?), not from
the settings of the process that cleans: an operator's laptop lacks the fleet's URL."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from orchestrator.cli.cleanup import describe
from orchestrator.runtime import Runtime
from orchestrator.services.cleanup import run_cleanup
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.services.tasks import Trigger
from orchestrator.store import task_events as event_store
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for

OLD = timedelta(days=40)  # past the 30 days of ORCH_RETENTION_DAYS


def _task_with_webhooks(rt: Runtime, *rows: tuple[str, int, timedelta]) -> str:
    """A task with one webhook per `(status, attempts, age)`, in event order."""
    task_id = rt.tasks.trigger(Trigger(task_type="t", title="Burst main")).task.task_id
    now = utcnow()
    for status, attempts, age in rows:
        with rt.db.transaction() as conn:
            event = event_store.record_event(conn, task_id, "waiting", reason="r")
            conn.execute(
                update(outbox)
                .where(outbox.c.task_id == task_id, outbox.c.event_seq == event.seq)
                .values(
                    status=status,
                    attempts=attempts,
                    created_at=now - age,
                    delivered_at=now - age if status == "delivered" else None,
                )
            )
    return task_id


def _left(rt: Runtime, task_id: str) -> list[tuple[str, int]]:
    with rt.db.transaction(readonly=True) as conn:
        rows = conn.execute(
            select(outbox.c.status, outbox.c.attempts)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "webhook")
            .order_by(outbox.c.event_seq)
        )
        return [(row.status, row.attempts) for row in rows]


def _retried(rt: Runtime, task_id: str) -> None:
    """The task's webhooks are dead letters an operator retried: pending, no attempt counted,
    the error of before kept."""
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "webhook")
            .values(last_error="HTTP 500")
        )


def test_never_sent_webhooks_expire_in_batches_where_nothing_ever_sent_one(
    store_url: str, tmp_path: Path
) -> None:
    """A fleet without a webhook receiver: no webhook of the store was ever delivered, dead,
    discarded or tried, and the never attempted ones go after the retention; approved actions
    and the recent stay."""
    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        done = _task_with_webhooks(
            rt, ("pending", 0, OLD), ("pending", 0, OLD), ("pending", 0, timedelta(days=1))
        )
        with rt.db.transaction() as conn:
            conn.execute(
                insert(outbox).values(
                    kind="action",
                    task_id=done,
                    action_id="act-1",
                    body="{}",
                    status="delivered",
                    attempts=1,
                    next_attempt_at=utcnow() - OLD,
                    created_at=utcnow() - OLD,
                    delivered_at=utcnow() - OLD,
                )
            )

        report = run_cleanup(rt.db, rt.settings, batch_size=1)

        assert (report.webhooks_delivered_deleted, report.webhooks_never_sent_deleted) == (0, 2)
        assert _left(rt, done) == [("pending", 0)]  # the one from yesterday
        with rt.db.transaction(readonly=True) as conn:
            assert conn.execute(select(outbox.c.status).where(outbox.c.kind == "action")).all()
        line = describe(report)
        assert "0 delivered or discarded and 2 never sent (nothing sends them) outbox" in line
        assert report.to_dict()["outbox_webhooks_deleted"] == {
            "delivered": 0,
            "never_sent": 2,
            "never_sent_in_scope": True,
            "never_sent_kept": None,
        }
    finally:
        rt.close()


@pytest.mark.parametrize("tried", ["being retried", "a retried dead letter"])
def test_a_webhook_being_retried_says_the_fleet_sends_them_and_keeps_the_never_attempted(
    store_url: str, tmp_path: Path, tried: str
) -> None:
    """A receiver that fails every time (its webhook pending, tried, not yet dead), or a dead
    letter an operator retried, is as much the store's proof that the fleet sends webhooks as
    a delivered one: before, it was ignored, and a cleanup without the fleet's URL deleted the
    never attempted events of other tasks, which the fleet's dispatcher would still send."""
    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        waiting = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
        if tried == "being retried":
            retrying = _task_with_webhooks(rt, ("pending", 2, OLD), ("pending", 0, OLD))
        else:
            retrying = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
            _retried(rt, retrying)
        report = run_cleanup(rt.db, rt.settings, batch_size=1)

        assert report.webhooks_never_sent_deleted == 0
        assert not report.never_sent_in_scope
        assert "webhooks were sent from this store" in describe(report)
        assert _left(rt, waiting) == [("pending", 0), ("pending", 0)]
        assert len(_left(rt, retrying)) == 2  # it follows the first
        # Told that the fleet has no receiver any more, the cleanup deletes the never attempted
        # ones (a retrying row and what follows it stay, as before).
        told = run_cleanup(rt.db, rt.settings, batch_size=1, unsent_webhooks=True)
        assert told.webhooks_never_sent_deleted == 2
        assert _left(rt, waiting) == []
    finally:
        rt.close()


def test_a_cleanup_without_the_fleets_url_keeps_the_events_the_fleet_would_deliver(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An operator's laptop has no ORCH_WEBHOOK_URL; the fleet has one, and its dispatcher was
    away longer than the retention. The cleanup deleted the events the fleet would deliver:
    the store, where webhooks were delivered, now says they are sent. It keeps the newest
    delivered one whatever its age, so a second pass still knows; `--unsent-webhooks` is
    how an operator says the fleet has no receiver any more."""
    from orchestrator.cli import main

    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        sent = _task_with_webhooks(rt, ("delivered", 1, OLD), ("delivered", 1, OLD))
        waiting = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
        held = _task_with_webhooks(rt, ("dead", 3, OLD), ("pending", 0, OLD))
        for _ in range(2):
            report = run_cleanup(rt.db, rt.settings, batch_size=1)
            assert _left(rt, waiting) == [("pending", 0), ("pending", 0)]
            assert _left(rt, sent) == [("delivered", 1)]  # the newest: the store's record
        assert not report.never_sent_in_scope
        assert "webhooks were sent from this store" in describe(report)
        assert "--unsent-webhooks" in str(report.never_sent_kept)
        monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
        monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("ORCH_WEBHOOK_URL", "http://127.0.0.1:9/hooks")
        monkeypatch.setenv("ORCH_WEBHOOK_SECRET", "webhook-secret-for-tests")
        assert main(["cleanup", "--unsent-webhooks"]) == 2  # its own dispatcher sends them
        assert "ORCH_WEBHOOK_URL is set here" in capsys.readouterr().err
        monkeypatch.delenv("ORCH_WEBHOOK_URL")
        monkeypatch.delenv("ORCH_WEBHOOK_SECRET")
        assert main(["cleanup", "--unsent-webhooks", "--json"]) == 0
        deleted = json.loads(capsys.readouterr().out)["outbox_webhooks_deleted"]
        assert (deleted["never_sent"], deleted["never_sent_in_scope"]) == (2, True)
        assert _left(rt, waiting) == []
        assert _left(rt, held) == [("dead", 3), ("pending", 0)]  # it follows its dead letter
    finally:
        rt.close()


def test_with_a_webhook_url_set_unsent_webhooks_wait_for_the_dispatcher_and_0_days_keeps_all(
    store_url: str, tmp_path: Path
) -> None:
    rt, _ = runtime_for(
        store_url,
        tmp_path / "scripts",
        retention_days=30,
        webhook_url="http://127.0.0.1:9/hooks",
        webhook_secret="webhook-secret-for-tests",
    )
    try:
        task_id = _task_with_webhooks(
            rt, ("delivered", 1, OLD), ("delivered", 1, OLD), ("pending", 0, OLD)
        )
        off = run_cleanup(rt.db, rt.settings.model_copy(update={"retention_days": 0}))
        assert not off.enabled
        assert _left(rt, task_id) == [("delivered", 1), ("delivered", 1), ("pending", 0)]
        report = run_cleanup(rt.db, rt.settings)
        assert (report.webhooks_delivered_deleted, report.webhooks_never_sent_deleted) == (1, 0)
        # The newest delivered one stays: the store's record that its webhooks are sent.
        assert _left(rt, task_id) == [("delivered", 1), ("pending", 0)]
        line = describe(report)
        assert "1 delivered or discarded outbox webhooks" in line, line
        assert "webhooks not sent yet (ORCH_WEBHOOK_URL is set)" in line, line
        assert "no ORCH_WEBHOOK_URL" not in line, line
    finally:
        rt.close()


def test_a_dispatcher_that_sends_during_the_cleanup_keeps_the_rest_of_its_webhooks(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleanup decides from the store that nothing sends webhooks, then deletes in
    batches; the fleet's dispatcher, back after an absence longer than the retention, delivers
    its first webhook meanwhile. The later batches went on deleting the never attempted events
    it was about to deliver: each batch checks again that no webhook was ever sent."""
    from orchestrator.services import cleanup as cleanup_module
    from orchestrator.store import outbox_retention, outbox_sending

    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        first = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
        second = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
        with rt.db.transaction(readonly=True) as conn:
            [sending, *_] = conn.execute(
                select(outbox.c.outbox_id)
                .where(outbox.c.task_id == second, outbox.c.kind == "webhook")
                .order_by(outbox.c.event_seq)
            ).scalars()
        real = outbox_retention.delete_expired_webhooks
        batches: list[tuple[int, int]] = []

        def batch(conn: Any, *args: Any, **kwargs: Any) -> tuple[int, int]:
            if len(batches) == 1:  # after the first batch: the dispatcher delivers one
                assert outbox_sending.mark_delivered(conn, sending)
            batches.append(real(conn, *args, **kwargs))
            return batches[-1]

        monkeypatch.setattr(cleanup_module.outbox_retention, "delete_expired_webhooks", batch)
        report = run_cleanup(rt.db, rt.settings, batch_size=1)
        assert report.webhooks_never_sent_deleted == 1  # the first batch's, before the send
        assert _left(rt, first) == [("pending", 0)]
        assert _left(rt, second) == [("delivered", 0), ("pending", 0)]
    finally:
        rt.close()


def _discard_first(rt: Runtime, task_id: str, *, age: timedelta = OLD) -> None:
    """An operator discards the task's first webhook (still pending), `age` ago."""
    with rt.db.transaction(readonly=True) as conn:
        first = conn.execute(
            select(outbox.c.outbox_id)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "webhook")
            .order_by(outbox.c.event_seq)
            .limit(1)
        ).scalar_one()
    OutboxService(rt.db).discard(first, reason="told them by phone", by="kim")
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == first)
            .values(discarded_at=utcnow() - age, created_at=utcnow() - age)
        )


@pytest.mark.parametrize(
    ("discarded", "sent"),
    [
        (("pending", 0, None), False),  # never attempted: nothing was ever sent
        (("pending", 2, "HTTP 503"), True),  # failing, then discarded: a dispatcher sends them
        (("pending", 0, "HTTP 503"), True),  # a dead letter retried, then discarded
        (("dead", 3, "HTTP 503"), True),  # dead-lettered, then discarded
    ],
)
def test_a_webhook_discarded_before_any_attempt_does_not_say_that_webhooks_are_sent(
    store_url: str, tmp_path: Path, discarded: tuple[str, int, str | None], sent: bool
) -> None:
    """A webhook an operator discarded while it was pending and never attempted was counted
    as sent (`kind_was_sent`, `webhooks_were_sent`): in a store where nothing sends webhooks,
    the task's view said nothing of `never_sent` for them, and the cleanup kept the never
    attempted ones for ever ("webhooks were sent from this store"). A discarded row counts as
    sent only when its row records an attempt (attempts, or the error of one)."""
    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        status, attempts, error = discarded
        settled = _task_with_webhooks(rt, (status, attempts, OLD), ("pending", 0, OLD))
        with rt.db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.task_id == settled, outbox.c.event_seq == 1)
                .values(last_error=error)
            )
        _discard_first(rt, settled, age=timedelta(days=1))  # recent: it stays
        waiting = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))

        assert OutboxService(rt.db).summary(waiting)["never_sent"] == ([] if sent else ["webhook"])
        report = run_cleanup(rt.db, rt.settings, batch_size=1)

        assert report.never_sent_in_scope is not sent
        if sent:
            assert "webhooks were sent from this store" in describe(report)
            assert _left(rt, waiting) == [("pending", 0), ("pending", 0)]
        else:
            assert report.webhooks_never_sent_deleted == 3  # the settled task's second too
            assert _left(rt, waiting) == []
        assert _left(rt, settled)[0] == ("discarded", attempts)
    finally:
        rt.close()


def test_the_newest_webhook_really_sent_is_kept_not_a_newer_one_discarded_unsent(
    store_url: str, tmp_path: Path
) -> None:
    """Retention keeps the newest settled webhook whatever its age, as the store's record that
    its webhooks are sent. A newer one discarded before any attempt is no such record: kept in
    its place, the delivered one went, and the next pass found nothing sent and deleted the
    never attempted events the fleet's dispatcher would deliver."""
    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        sent = _task_with_webhooks(rt, ("delivered", 1, OLD), ("delivered", 1, OLD))
        unsent = _task_with_webhooks(rt, ("pending", 0, OLD))
        _discard_first(rt, unsent)
        waiting = _task_with_webhooks(rt, ("pending", 0, OLD), ("pending", 0, OLD))
        for _ in range(2):
            report = run_cleanup(rt.db, rt.settings, batch_size=1)
            assert not report.never_sent_in_scope
            assert _left(rt, waiting) == [("pending", 0), ("pending", 0)]
            assert _left(rt, sent) == [("delivered", 1)]  # the newest really sent
        assert _left(rt, unsent) == []  # discarded past the retention
    finally:
        rt.close()
