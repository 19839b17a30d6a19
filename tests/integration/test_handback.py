"""A round that stopped itself hands its generation back: the lease mirrored in the store ends
at once, so the next sweep requeues it, instead of a wait of ORCH_LEASE_SECONDS (two minutes by
default) for every round a store restart stopped or whose lease another holder took. Fenced by
the round's own lease token, and only while its execution is open. Both stores."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.domain.fences import Fence
from orchestrator.runtime import Runtime
from orchestrator.services import executions as executions_module
from orchestrator.services import handback as handback_module
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import generation_claims as claim_store
from orchestrator.store import generations as generation_store
from orchestrator.store.types import utcnow
from orchestrator.tools.command import ExecuteCommand
from orchestrator.tools.plans import PublishExecutionPlan
from tests.executions_support import (
    node,
    plan_call,
    runtime_for,
    simple_task,
    wait_for,
    write_script,
)


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, RecordingDispatcher]]:
    # The default lease: what a round that stopped itself used to wait out.
    rt, dispatcher = runtime_for(store_url, scripts, lease_seconds=120, lease_renew_seconds=40)
    yield rt, dispatcher
    rt.close()


def _mirrored_expiry(rt: Runtime, task_id: str, generation: int) -> Any:
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    assert execution is not None
    return execution


def _store_down(*_args: Any, **_kwargs: Any) -> Any:
    raise OperationalError("UPDATE tasks", {}, Exception("server closed the connection"))


def test_a_round_stopped_by_the_store_is_requeued_at_the_next_sweep(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, dispatcher = env
    assert rt.settings.lease_seconds >= 60  # the wait this saves
    task_id = simple_task(rt, scripts)
    monkeypatch.setattr(executions_module, "finish_generation", _store_down)
    result = rt.executions.run(task_id, 1, worker="w1")
    assert (result.ran, result.outcome) == (True, None)
    execution = _mirrored_expiry(rt, task_id, 1)
    assert execution.outcome is None  # left open: not failed for a fault not the task's
    assert execution.lease_expires_at <= utcnow()  # before: now + ORCH_LEASE_SECONDS
    report = rt.sweeper.sweep()
    assert report.requeued == [(task_id, 1, 2)]
    assert (rt.tasks.get(task_id).status, rt.tasks.get(task_id).generation) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)


def _taken_over(rt: Runtime, task_id: str) -> None:
    """Another holder has the lease now (as after a Redis that lost its data, and a wake-up
    that took the free lease before the round took it back)."""
    info = rt.leases.get(f"task:{task_id}")
    assert info is not None
    rt.leases.release(f"task:{task_id}", info.token)
    assert rt.leases.acquire(f"task:{task_id}", "intruder", 120) is not None


def _take_over_after_revision(
    monkeypatch: pytest.MonkeyPatch, rt: Runtime, task_id: str, revision: int
) -> None:
    """Another holder takes the lease once plan `revision` is written, before the write's
    renewal, and keeps it: that renewal and the next are refused, and the round stops once the
    lease it last renewed nears its end (the store says its generation is live meanwhile)."""
    real_renew = PublishExecutionPlan._renew

    def take_over(self: PublishExecutionPlan, result: object) -> None:
        if rt.tasks.explain(task_id)["plan"]["revision"] == revision:
            _taken_over(rt, task_id)
        real_renew(self, result)

    monkeypatch.setattr(PublishExecutionPlan, "_renew", take_over)


def test_a_round_whose_lease_another_holder_keeps_is_requeued_at_the_next_sweep(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another holder takes the lease and keeps it; the store is fine and says the generation is
    # live under the round's token. The round goes on (such a holder is most often a wake-up of
    # the generation about to give the lease back), but only within the lease it last renewed:
    # then it stops without writing, hands its generation back, and the next sweep requeues it.
    rt, _ = runtime_for(store_url, scripts, lease_seconds=1, lease_renew_seconds=0.5)
    try:
        write_script(
            scripts,
            "simple",
            [
                {"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]},
                {
                    "delay_s": 30,  # cut short when the round stops
                    "tool_calls": [
                        plan_call("c2", "r2", [node("a", "running"), node("b", "pending")])
                    ],
                },
                {"content": "done"},
            ],
        )
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        _take_over_after_revision(monkeypatch, rt, task_id, 1)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert (result.ran, result.outcome) == (True, None)
        assert "stopped without writing" in result.detail
        assert rt.tasks.explain(task_id)["plan"]["revision"] == 1
        assert _mirrored_expiry(rt, task_id, 1).lease_expires_at <= utcnow()
        # Held by another while the store said live: an outage (not a worker that stalled).
        assert _mirrored_expiry(rt, task_id, 1).handed_back_at is not None
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
        assert (rt.tasks.get(task_id).recoveries, rt.tasks.get(task_id).handbacks) == (0, 1)
    finally:
        rt.close()


def test_a_round_whose_lease_vanished_takes_it_back_and_goes_on(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As after a Redis restart that lost its data: the lease is gone. Before, the next renewal
    # was refused and the round stopped, its generation lost. Now the round takes its lease
    # back (the store says its generation is live) and ends as it would have.
    from orchestrator import metrics

    rt, _ = env
    task_id = simple_task(rt, scripts)
    real_renew = PublishExecutionPlan._renew
    seen: list[str | None] = []

    def wipe_after_the_first_write(self: PublishExecutionPlan, result: object) -> None:
        info = rt.leases.get(f"task:{task_id}")
        if info is not None and rt.tasks.explain(task_id)["plan"]["revision"] == 1:
            rt.leases.release(f"task:{task_id}", info.token)
        real_renew(self, result)
        after = rt.leases.get(f"task:{task_id}")
        seen.append(None if after is None else after.holder)

    monkeypatch.setattr(PublishExecutionPlan, "_renew", wipe_after_the_first_write)
    before = metrics.LEASES_TAKEN_BACK._value.get()
    result = rt.executions.run(task_id, 1, worker="w1")
    assert (result.ran, result.outcome) == (True, "completed")
    assert seen[0] == "w1"  # taken back under its own name by the write's renewal
    assert metrics.LEASES_TAKEN_BACK._value.get() == before + 1
    execution = _mirrored_expiry(rt, task_id, 1)
    assert (execution.outcome, execution.handed_back_at) == ("completed", None)
    assert rt.tasks.get(task_id).generation == 1  # no generation lost


def test_a_hand_back_the_store_refused_lands_once_it_answers(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, _ = env
    task_id = simple_task(rt, scripts)
    monkeypatch.setattr(executions_module, "finish_generation", _store_down)
    monkeypatch.setattr(handback_module, "RETRY_SECONDS", 0.05)
    real_hand_back = generation_store.hand_back
    calls = {"n": 0}

    def away_twice(*args: Any, **kwargs: Any) -> bool:
        calls["n"] += 1
        if calls["n"] <= 2:
            _store_down()
        return real_hand_back(*args, **kwargs)

    monkeypatch.setattr(handback_module.generation_store, "hand_back", away_twice)
    rt.executions.run(task_id, 1, worker="w1")
    wait_for(lambda: rt.executions.handback.pending() == 0, timeout=10)
    assert calls["n"] == 3  # the first try and one retry met the store away
    assert _mirrored_expiry(rt, task_id, 1).lease_expires_at <= utcnow()


def test_a_hand_back_leaves_a_generation_that_ended_or_another_token_alone(env: Any) -> None:
    rt, _ = env
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    with rt.db.transaction() as conn:
        expires = utcnow() + timedelta(seconds=120)
        assert claim_store.claim_generation(
            conn,
            task_id,
            1,
            lease_token="a" * 32,
            worker="w1",
            celery_task_id=None,
            lease_expires_at=expires,
        )
    # Another holder's token: nothing changes.
    assert rt.executions.handback.give_back(Fence(task_id, 1, "b" * 32))
    assert _mirrored_expiry(rt, task_id, 1).lease_expires_at == expires
    # The generation ended (a cancel): nothing changes either.
    rt.tasks.cancel(task_id, reason="no longer needed")
    ended = _mirrored_expiry(rt, task_id, 1)
    assert ended.outcome is not None
    assert rt.executions.handback.give_back(Fence(task_id, 1, "a" * 32))
    assert _mirrored_expiry(rt, task_id, 1).lease_expires_at == ended.lease_expires_at


def test_a_round_hands_back_only_once_its_background_commands_are_reaped(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hand-back lets the next sweep requeue the generation at once: a background command
    # of the stopped round must be gone by then, not left running beside the next generation
    # (invariant 7) until the round's clean-up reaches it.
    # A 2 s lease: with 1 s, a loaded machine (load 10) held a renewal back past the lease's
    # end, and the round stopped on a lease it found gone, not on the holder that took it.
    rt, _ = runtime_for(
        store_url, scripts, lease_seconds=2, lease_renew_seconds=0.5, enable_command_tool=True
    )
    try:
        write_script(
            scripts,
            "simple",
            [
                {"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]},
                {
                    "tool_calls": [
                        {
                            "id": "bg",
                            "name": "execute_command",
                            "arguments": {"action": "start", "command": "sleep 30"},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        plan_call("c2", "r2", [node("a", "running"), node("b", "pending")])
                    ]
                },
                {"delay_s": 30, "content": "done"},  # cut short when the round stops
            ],
        )
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        # Another holder keeps the lease: the round stops once the lease it renewed nears its end.
        _take_over_after_revision(monkeypatch, rt, task_id, 2)
        [command] = [t for t in rt.executions.receipt_tools if isinstance(t, ExecuteCommand)]
        seen: list[list[str]] = []
        real_give_back = rt.executions.handback.give_back

        def give_back(fence: Fence, **kwargs: Any) -> bool:
            session_id = rt.tasks.get(task_id).session_id
            assert session_id is not None
            seen.append(command.background(session_id)[1])  # still running when handed back
            return real_give_back(fence, **kwargs)

        monkeypatch.setattr(rt.executions.handback, "give_back", give_back)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert "stopped without writing" in result.detail
        assert seen == [[]]
        assert _mirrored_expiry(rt, task_id, 1).lease_expires_at <= utcnow()
    finally:
        rt.close()


def test_a_claim_that_committed_with_its_answer_lost_is_handed_back(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store went away as the claim committed: the worker cannot tell, gives the lease back
    # and tries again later. The generation it did claim holds a token no lease backs; it is
    # handed back, so the next sweep requeues it, not a lease later.
    rt, dispatcher = env
    task_id = simple_task(rt, scripts)
    real_claim = executions_module.claim_store.claim_generation_alone

    def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
        real_claim(*args, **kwargs)
        _store_down()  # the claim committed; its answer never came back

    monkeypatch.setattr(
        executions_module.claim_store, "claim_generation_alone", committed_then_lost
    )
    result = rt.executions.run(task_id, 1, worker="w1")
    assert (result.ran, result.retry_after) == (False, rt.settings.lease_renew_seconds)
    monkeypatch.undo()
    execution = _mirrored_expiry(rt, task_id, 1)
    assert execution.started_at is not None  # the claim did commit
    assert execution.outcome is None
    assert execution.lease_expires_at <= utcnow()  # before: now + ORCH_LEASE_SECONDS
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    assert dispatcher.sent[-1] == (task_id, 2)
    # The wake-up tried again finds generation 1 over and starts nothing.
    assert not rt.executions.run(task_id, 1, worker="w1").ran


def test_a_claim_that_did_not_commit_hands_nothing_back(
    env: Any, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, _ = env
    task_id = simple_task(rt, scripts)
    monkeypatch.setattr(executions_module.claim_store, "claim_generation_alone", _store_down)
    assert not rt.executions.run(task_id, 1, worker="w1").ran
    monkeypatch.undo()
    assert rt.sweeper.sweep().requeued == []
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
