"""A wake-up the broker refused at its commit goes out at the next sweep, not after
ORCH_QUEUED_STALE_SECONDS: the store records it (`queued_at` NULL), and a sweep sends those first,
each claimed by a compare-and-set, and records it again while the broker still refuses.

The refusing broker is a real Celery dispatcher on a port where nothing listens; the one that
takes wake-ups is the `RecordingDispatcher` the other sweeper tests use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, select

from orchestrator.cli import main
from orchestrator.cli.task_show import render_explain
from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import driver
from orchestrator.store import tasks as task_store
from orchestrator.store.records import TaskRecord
from orchestrator.store.tables import executions, tasks
from orchestrator.store.types import utcnow
from tests.executions_support import claim_as_worker, settings_for
from tests.integration.test_approvals import waiting_task
from tests.services import refused_port
from workers.celery_app import CeleryDispatcher, make_celery


class Broker:
    """Down (a real Celery dispatcher on a port where nothing listens: every wake-up refused)
    or up (the wake-ups are kept in `up`)."""

    def __init__(self, tmp_path: Path) -> None:
        url = f"redis://127.0.0.1:{refused_port()}/0"
        self.refusing = CeleryDispatcher(make_celery(load_settings(redis_url=url, home=tmp_path)))
        self.up: RecordingDispatcher | None = None
        self.before_refusing: Callable[[], None] = lambda: None

    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        if self.up is not None:
            self.up.dispatch(task_id, generation, again=again)
            return
        self.before_refusing()
        self.refusing.dispatch(task_id, generation, again=again)


@pytest.fixture
def down(tmp_path: Path) -> Broker:
    return Broker(tmp_path / "home")


@pytest.fixture
def rt(store_url: str, tmp_path: Path, down: Broker) -> Iterator[Runtime]:
    # A minute before a queued wake-up is taken for lost, as by default: the unsent ones must
    # not wait for it.
    runtime = build_runtime(
        settings_for(store_url, tmp_path, queued_stale_seconds=60), dispatcher=down
    )
    yield runtime
    runtime.close()


def trigger_while_down(rt: Runtime, down: Broker, title: str = "t") -> str:
    down.up = None
    result = rt.tasks.trigger(Trigger(task_type="simple", title=title))
    assert (result.dispatched, result.unsent_recorded) == (False, True)
    assert result.dispatch_error is not None
    return result.task.task_id


def broker_back(down: Broker) -> RecordingDispatcher:
    down.up = RecordingDispatcher()
    return down.up


def test_a_trigger_the_broker_refused_is_sent_at_the_next_sweep(rt: Runtime, down: Broker) -> None:
    task_id = trigger_while_down(rt, down)
    view = rt.tasks.explain(task_id)
    assert view["wake_up_unsent"] is True
    assert "wake-up not sent: the broker refused it" in render_explain(view)
    up = broker_back(down)
    report = rt.sweeper.sweep()
    # Before, nothing: the wake-up waited ORCH_QUEUED_STALE_SECONDS (a minute) to look lost.
    assert report.republished == [(task_id, 1)]
    assert up.sent_again == [(task_id, 1)]  # the worker reads the store before the lease
    assert rt.sweeper.sweep().republished == []  # sent once: the record is cleared
    assert rt.tasks.explain(task_id)["wake_up_unsent"] is False
    assert rt.tasks.get(task_id).queued_at is not None


def test_tasks_list_says_which_wake_ups_were_not_sent(
    rt: Runtime,
    down: Broker,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tasks list` said `queued` alone, as for a wake-up on its way (the view, the API's list
    and the console say it)."""
    unsent = trigger_while_down(rt, down, title="unsent")
    broker_back(down)
    sent = rt.tasks.trigger(Trigger(task_type="simple", title="sent")).task.task_id
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    assert main(["tasks", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[unsent].endswith("unsent  [wake-up not sent: the sweeper sends it]")
    assert rows[sent].endswith("  sent")


def test_a_requeue_the_broker_refused_is_sent_at_the_next_sweep(rt: Runtime, down: Broker) -> None:
    broker_back(down)
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="r")).task.task_id
    down.up = None
    rt.tasks.requeue(task_id, "try again", by="op")
    up = broker_back(down)
    assert rt.sweeper.sweep().republished == [(task_id, 2)]
    assert up.sent_again == [(task_id, 2)]


def test_an_approval_the_broker_refused_is_sent_at_the_next_sweep(
    rt: Runtime, down: Broker, tmp_path: Path
) -> None:
    broker_back(down)
    task_id, action_id = waiting_task(rt, tmp_path)
    down.up = None
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="ana", note=None, digest=digest)
    assert (rt.tasks.get(task_id).status, rt.tasks.get(task_id).generation) == ("queued", 2)
    up = broker_back(down)
    assert rt.sweeper.sweep().republished == [(task_id, 2)]
    assert up.sent_again == [(task_id, 2)]


def test_while_the_broker_still_refuses_the_record_stays_for_the_next_sweep(
    rt: Runtime, down: Broker
) -> None:
    first = trigger_while_down(rt, down, "first")
    second = trigger_while_down(rt, down, "second")
    assert rt.sweeper.sweep().republished == []  # still down: tried once, recorded again
    assert {t.task_id for t in _unsent(rt)} == {first, second}
    up = broker_back(down)
    assert sorted(rt.sweeper.sweep().republished) == sorted([(first, 1), (second, 1)])
    assert sorted(up.sent_again) == sorted([(first, 1), (second, 1)])


def test_a_stale_wake_up_the_broker_refused_is_sent_at_the_next_sweep(
    rt: Runtime, down: Broker
) -> None:
    """The sweeper's own republish: before, it moved `queued_at` to now before the broker
    refused, so the next try waited ORCH_QUEUED_STALE_SECONDS more once the broker was back."""
    broker_back(down)
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="s")).task.task_id
    later = utcnow() + timedelta(seconds=61)
    down.up = None
    assert rt.sweeper.sweep(later).republished == []
    up = broker_back(down)
    assert rt.sweeper.sweep().republished == [(task_id, 1)]  # now, not a minute on
    assert up.sent_again == [(task_id, 1)]


def test_an_unsent_wake_up_is_sent_by_one_sweeper_and_not_for_a_claimed_generation(
    rt: Runtime, down: Broker
) -> None:
    sent = trigger_while_down(rt, down, "sent")
    claimed = trigger_while_down(rt, down, "claimed")
    [seen, _] = sorted(_unsent(rt), key=lambda t: t.task_id != sent)
    claim_as_worker(rt, claimed, 1, "a-worker", 30)  # a wake-up did arrive: none is needed
    up = broker_back(down)
    assert rt.sweeper.sweep().republished == [(sent, 1)]
    assert up.sent_again == [(sent, 1)]
    with rt.db.transaction() as conn:  # a second sweeper that read the record before
        assert task_store.touch_queued(conn, seen) is False


def test_a_store_that_fails_at_the_record_writes_nothing_and_the_trigger_still_answers(
    pg_url: str, tmp_path: Path
) -> None:
    """The broker refuses the wake-up and the store is cut off before the record (the database
    takes no connection, its sessions are ended): the trigger answers (not sent, not recorded)
    without raising, and the task stays as it committed, found by the stale republish."""
    database = pg_url.rsplit("/", 1)[1]
    admin = pg_url.rsplit("/", 1)[0].replace("postgresql+psycopg", "postgresql") + "/postgres"
    broker = Broker(tmp_path / "home")
    broker.before_refusing = lambda: _allow_connections(admin, database, False)
    settings = settings_for(pg_url, tmp_path, queued_stale_seconds=60)
    runtime = build_runtime(settings, dispatcher=broker)
    try:
        result = runtime.tasks.trigger(Trigger(task_type="simple", title="cut"))
        assert (result.dispatched, result.unsent_recorded) == (False, False)
        _allow_connections(admin, database, True)
        with runtime.db.transaction(readonly=True) as conn:
            [row] = conn.execute(select(tasks.c.status, tasks.c.queued_at)).all()
            assert row.status == "queued"
            assert row.queued_at is not None  # no record written
            assert len(conn.execute(select(executions.c.task_id)).all()) == 1
        up = broker_back(broker)
        assert runtime.sweeper.sweep().republished == []  # not recorded: it waits the minute
        later = utcnow() + timedelta(seconds=61)
        assert runtime.sweeper.sweep(later).republished == [(result.task.task_id, 1)]
        assert up.sent_again == [(result.task.task_id, 1)]
    finally:
        _allow_connections(admin, database, True)
        runtime.close()


def _allow_connections(admin_url: str, database: str, allow: bool) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS {str(allow).lower()}'  # type: ignore[arg-type]
        )
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


def _unsent(rt: Runtime) -> list[TaskRecord]:
    with rt.db.transaction(readonly=True) as conn:
        rows = conn.execute(select(tasks).where(tasks.c.queued_at.is_(None)))
        return [TaskRecord.from_row(row) for row in rows]


def test_a_trigger_whose_wake_up_went_out_sends_no_statement_more(
    pg_url: str, tmp_path: Path
) -> None:
    """The trigger is on the benchmarked trigger-to-start path: its one statement on Postgres,
    as before the record; only a refused wake-up adds one (the record, an UPDATE)."""
    broker = Broker(tmp_path / "home")
    runtime = build_runtime(settings_for(pg_url, tmp_path), dispatcher=broker)
    sent: list[str] = []

    def observe(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement.split()[0])

    def told(sql: str, autocommit: bool) -> None:  # the statements sent past SQLAlchemy
        sent.append(sql.split()[0])

    try:
        broker_back(broker)
        runtime.tasks.trigger(Trigger(task_type="simple", title="warm"))  # the pool's first use
        event.listen(runtime.db.engine, "before_cursor_execute", observe)
        driver.observers.append(told)
        runtime.tasks.trigger(Trigger(task_type="simple", title="sent"))
        assert sent == ["WITH"]  # the task, its session and execution in one INSERT
        sent.clear()
        broker.up = None
        assert runtime.tasks.trigger(Trigger(task_type="simple", title="refused")).unsent_recorded
        assert sent == ["WITH", "UPDATE"]
    finally:
        driver.observers.remove(told)
        event.remove(runtime.db.engine, "before_cursor_execute", observe)
        runtime.close()


def test_recover_says_the_wake_ups_the_broker_still_refuses_and_exits_1(
    rt: Runtime,
    down: Broker,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An operator runs `orchestrator recover` for a task whose wake-up Redis refused, with
    Redis still down. Before, it printed `nothing to recover` and exited 0 (the task stayed
    queued, nothing said so but a log line); now it names the wake-up the broker did not take
    and exits 1, as it does when Redis is down and expired generations could not be checked."""
    from orchestrator.cli import main

    task_id = trigger_while_down(rt, down)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_REDIS_URL", f"redis://127.0.0.1:{refused_port()}/0")  # nothing there
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "cli-home"))
    capsys.readouterr()
    assert main(["recover"]) == 1
    said = capsys.readouterr()
    assert "nothing to recover" not in said.out
    assert (
        f"orchestrator: the broker did not take 1 wake-up(s) this sweep sent (task {task_id} "
        "generation 1): they are recorded, and the next sweep sends them first once the broker "
        "takes messages again"
    ) in said.err
    assert main(["recover", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["unsent"] == [{"task_id": task_id, "generation": 1}]
    assert rt.tasks.explain(task_id)["wake_up_unsent"] is True  # still recorded for the sweeper
