"""Retention of the outbox's webhooks: delivered ones and those nobody sends go after
ORCH_RETENTION_DAYS; dead letters, retrying rows and approved actions stay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import insert, select, update

from orchestrator.cli.cleanup import describe
from orchestrator.runtime import Runtime
from orchestrator.services.cleanup import run_cleanup
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


def test_delivered_and_never_sent_webhooks_expire_in_batches_dead_letters_and_actions_stay(
    store_url: str, tmp_path: Path
) -> None:
    rt, _ = runtime_for(store_url, tmp_path / "scripts", retention_days=30)  # no webhook URL
    try:
        done = _task_with_webhooks(
            rt, ("delivered", 1, OLD), ("pending", 0, OLD), ("pending", 0, timedelta(days=1))
        )
        # A dead letter holds its task's later events back; they follow it once retried.
        held = _task_with_webhooks(rt, ("dead", 3, OLD), ("pending", 0, OLD))
        retrying = _task_with_webhooks(rt, ("pending", 2, OLD))
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
        recent = _task_with_webhooks(rt, ("delivered", 1, timedelta(days=29)))

        report = run_cleanup(rt.db, rt.settings, batch_size=1)

        assert (report.webhooks_delivered_deleted, report.webhooks_never_sent_deleted) == (1, 1)
        assert _left(rt, done) == [("pending", 0)]  # the one from yesterday
        assert _left(rt, held) == [("dead", 3), ("pending", 0)]
        assert _left(rt, retrying) == [("pending", 2)]
        assert _left(rt, recent) == [("delivered", 1)]
        with rt.db.transaction(readonly=True) as conn:
            assert conn.execute(select(outbox.c.status).where(outbox.c.kind == "action")).all()
        line = describe(report)
        deleted = "1 delivered or discarded and 1 never sent (no ORCH_WEBHOOK_URL) outbox webhooks"
        assert deleted in line
        assert report.to_dict()["outbox_webhooks_deleted"] == {
            "delivered": 1,
            "never_sent": 1,
            "never_sent_in_scope": True,
        }
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
        task_id = _task_with_webhooks(rt, ("delivered", 1, OLD), ("pending", 0, OLD))
        off = run_cleanup(rt.db, rt.settings.model_copy(update={"retention_days": 0}))
        assert not off.enabled
        assert _left(rt, task_id) == [("delivered", 1), ("pending", 0)]
        report = run_cleanup(rt.db, rt.settings)
        assert (report.webhooks_delivered_deleted, report.webhooks_never_sent_deleted) == (1, 0)
        assert _left(rt, task_id) == [("pending", 0)]
        line = describe(report)
        assert "1 delivered or discarded outbox webhooks" in line, line
        assert "webhooks not sent yet (ORCH_WEBHOOK_URL is set)" in line, line
        assert "no ORCH_WEBHOOK_URL" not in line, line
    finally:
        rt.close()
