"""Edges of the execution service: racing triggers, long titles, lost leases inside tools,
infrastructure errors, and wake-ups that find nothing to do. Both stores."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from orchestrator.runtime import Runtime
from orchestrator.services import executions as executions_module
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store.tables import sessions
from tests.executions_support import (
    completing_turns,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    simple_task,
    wait_for,
    write_script,
)
from tests.services import RedisServer, ServiceMissing, service_unavailable


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, RecordingDispatcher]]:
    rt, dispatcher = runtime_for(store_url, scripts)
    yield rt, dispatcher
    rt.close()


def test_concurrent_triggers_with_one_id_create_one_task(env: Any) -> None:
    rt, dispatcher = env
    barrier = threading.Barrier(8)
    results: list[Any] = []
    errors: list[BaseException] = []

    def fire() -> None:
        barrier.wait()
        try:
            results.append(
                rt.tasks.trigger(Trigger(task_type="simple", title="t", trigger_id="race"))
            )
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len({r.task.task_id for r in results}) == 1
    assert sorted(r.created for r in results) == [False] * 7 + [True]
    assert len(dispatcher.sent) == 1


def test_a_title_of_the_longest_allowed_length_runs_through_many_generations(
    env: Any, scripts: Path
) -> None:
    rt, _ = env
    title = "x" * 200
    task = rt.tasks.trigger(Trigger(task_type="simple", title=title)).task
    for _ in range(3):
        rt.tasks.requeue(task.task_id, "again")
    view = rt.tasks.explain(task.task_id)
    assert view["generation"] == 4
    with rt.db.transaction(readonly=True) as conn:
        titles = (
            conn.execute(select(sessions.c.title).where(sessions.c.task_id == task.task_id))
            .scalars()
            .all()
        )
    assert len(titles) == 4
    assert all(len(t) <= 200 for t in titles)
    assert sorted(t.rsplit("(", 1)[1] for t in titles) == [f"generation {n})" for n in (1, 2, 3, 4)]


def test_a_lost_lease_inside_a_tool_stops_the_round_at_once(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, _ = env
    write_script(
        scripts,
        "simple",
        [
            {"tool_calls": [query_call(), plan_call("c1", "r1", [node("a", "running")])]},
            {"tool_calls": [plan_call("c2", "r2", [node("a", "completed")])]},
            {"tool_calls": [report_call("c3", "completed")]},
            {"content": "done"},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    from orchestrator.services.lease_keeper import LeaseKeeper

    calls = {"n": 0}
    real_check = LeaseKeeper.check

    def check_that_loses_on_the_second_write(self: LeaseKeeper) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            self.lost.set()
        real_check(self)

    monkeypatch.setattr(LeaseKeeper, "check", check_that_loses_on_the_second_write)
    result = rt.executions.run(task_id, 1, worker="w1")
    assert result.ran
    assert result.outcome is None
    assert "stopped" in result.detail
    view = rt.tasks.explain(task_id)
    # Only the first plan was written; the second call and the report never ran.
    assert view["plan"]["revision"] == 1
    assert view["report"] is None
    assert view["executions"][0]["outcome"] is None


def test_a_lease_in_doubt_after_a_write_ends_the_transcript_there(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second plan write goes through, then the lease comes into doubt (the heartbeat's
    renewal failed meanwhile): its result is not written to the transcript, though the store's
    fence (nothing superseded the generation) would still take it; the snapshot keeps it."""
    rt, _ = env
    write_script(
        scripts,
        "simple",
        [
            {"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]},
            {"tool_calls": [plan_call("c2", "r2", [node("a", "running"), node("b", "pending")])]},
            {"content": "done"},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    from orchestrator.tools.plans import PublishExecutionPlan

    writes = {"n": 0}
    real_renew = PublishExecutionPlan._renew

    def doubt_after_the_second_write(self: PublishExecutionPlan, result: object) -> None:
        real_renew(self, result)
        writes["n"] += 1
        if writes["n"] == 2:
            self.keeper.lost.set()

    monkeypatch.setattr(PublishExecutionPlan, "_renew", doubt_after_the_second_write)
    result = rt.executions.run(task_id, 1, worker="w1")
    assert (result.ran, result.outcome) == (True, None)
    assert rt.tasks.explain(task_id)["plan"]["revision"] == 2
    entries = rt.tasks.transcript(task_id)["items"]
    assert [(e["turn"], e["kind"], e.get("call_id")) for e in entries] == [
        (1, "model_turn", None),
        (1, "tool_result", "c1"),
        (2, "model_turn", None),
    ]


def test_a_store_error_at_the_decision_leaves_the_generation_to_recovery(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, _ = env
    task_id = simple_task(rt, scripts)

    def store_down(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("UPDATE tasks", {}, Exception("server closed the connection"))

    monkeypatch.setattr(executions_module, "finish_generation", store_down)
    result = rt.executions.run(task_id, 1, worker="w1")
    assert (result.ran, result.outcome) == (True, None)
    view = rt.tasks.explain(task_id)
    # Not failed for a fault that is not the task's: still running, its lease released, so
    # the sweeper requeues it once the mirrored expiry passes.
    assert view["status"] == "running"
    assert view["failure_code"] is None
    assert view["executions"][0]["outcome"] is None
    assert rt.leases.get(f"task:{task_id}") is None


def test_a_late_duplicate_wakeup_of_a_finished_generation_leaves_no_lease_behind(
    env: Any, scripts: Path
) -> None:
    rt, _ = env
    task_id = simple_task(rt, scripts)
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
    again = rt.executions.run(task_id, 1, worker="w2")
    assert not again.ran
    assert again.retry_after is None
    assert "completed" in again.detail
    assert rt.leases.get(f"task:{task_id}") is None


def test_a_wakeup_while_another_worker_holds_the_lease_retries_only_for_its_own_generation(
    env: Any, scripts: Path
) -> None:
    rt, _ = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    token = rt.leases.acquire(f"task:{task_id}", "someone", 30)
    assert token is not None
    mine = rt.executions.run(task_id, 1, worker="w1")
    assert not mine.ran
    assert mine.retry_after is not None  # generation 1 is queued: come back later
    stale = rt.executions.run(task_id, 7, worker="w1")
    assert not stale.ran
    assert stale.retry_after is None  # not the task's generation: nothing to wait for


def test_the_explain_view_shows_the_lease_of_a_running_generation(env: Any, scripts: Path) -> None:
    rt, _ = env
    write_script(scripts, "simple", completing_turns(delay_s=1.5))
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    runner = threading.Thread(target=rt.executions.run, args=(task_id, 1), kwargs={"worker": "w1"})
    runner.start()
    try:
        view = wait_for(
            lambda: (v := rt.tasks.explain(task_id))["lease"] is not None and v,
            10,
            what="the running generation's lease",
        )
        lease = view["lease"]
        assert view["status"] == "running"
        assert lease["holder"] == "w1"
        assert lease["expires_at"] > lease["last_renewed_at"]
    finally:
        runner.join(timeout=30)
    assert rt.tasks.explain(task_id)["lease"] is None


def test_a_background_command_does_not_outlive_its_round(store_url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    marker = tmp_path / "still-running"
    # A background command that would touch the marker after 3 s, unless killed with the round.
    command = f"sleep 3 && touch {marker}"
    start = {
        "id": "c1",
        "name": "execute_command",
        "arguments": {"action": "start", "command": command},
    }
    write_script(
        scripts,
        "simple",
        [{"tool_calls": [start]}, *completing_turns()],
    )
    rt, _ = runtime_for(store_url, scripts, enable_command_tool=True)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        # Invariant 23: still running at round end, so the task is not completed; the command
        # is reaped with the round and its receipt becomes unknown, never left pending.
        assert result.outcome == "waiting"
        view = rt.tasks.explain(task_id)
        assert view["status"] == "waiting"
        assert [r["status"] for r in view["unknown_receipts"]] == ["unknown"]
        time.sleep(3.5)
        assert not marker.exists()
    finally:
        rt.close()


def test_a_store_error_at_the_claim_gives_the_lease_back_and_asks_to_come_back(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A wake-up that meets the store away (a restart) claims nothing: it must not keep the
    # lease until it runs out, nor leave the generation queued until the sweeper re-sends
    # stale wake-ups (a minute by default); the worker tries again after a renewal period.
    rt, _ = env
    write_script(scripts, "claim", completing_turns())
    task_id = rt.tasks.trigger(Trigger(task_type="claim", title="t")).task.task_id

    def store_down(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("WITH claimed_task", {}, Exception("server closed the connection"))

    with monkeypatch.context() as patched:
        patched.setattr(executions_module.claim_store, "claim_generation_alone", store_down)
        result = rt.executions.run(task_id, 1, worker="w")
    assert result.ran is False
    assert result.retry_after == rt.settings.lease_renew_seconds
    assert "could not be reached to claim" in result.detail
    assert "server closed the connection" in caplog.text
    assert rt.tasks.get(task_id).status == "queued"
    # The lease was given back: the next wake-up runs the generation at once.
    assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"


def test_a_wake_up_that_meets_redis_away_comes_back_later_and_says_why(
    pg_url: str, scripts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, the lease back end's error escaped the service: Celery logged it with a
    # traceback and acknowledged the wake-up, and the generation stayed queued until the
    # sweeper took its wake-up for lost (a minute by default).
    server = RedisServer()
    try:
        server.start()
    except ServiceMissing as exc:
        service_unavailable(str(exc))
    rt, _ = runtime_for(pg_url, scripts, redis_url=server.url)
    try:
        write_script(scripts, "claim", completing_turns())
        task_id = rt.tasks.trigger(Trigger(task_type="claim", title="t")).task.task_id
        server.stop()
        result = rt.executions.run(task_id, 1, worker="w")
        assert result.ran is False
        assert result.retry_after == rt.settings.lease_renew_seconds
        assert "lease back end could not be reached" in result.detail
        assert "Redis did not answer the lease call" in caplog.text
        assert rt.tasks.get(task_id).status == "queued"
        server.start()
        assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
    finally:
        rt.close()
        server.close()
