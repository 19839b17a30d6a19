"""Recovery: expired leases requeue once, racing sweepers agree, caps park, lost wake-ups return."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import ended_key, task_lease
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.sweeper import BROKER_MARK
from orchestrator.services.tasks import Trigger
from orchestrator.store import actions as action_store
from orchestrator.store import executions as execution_store
from orchestrator.store import task_plans
from tests.executions_support import claim_as_worker, node, plan_call, runtime_for, sweep_at_once

TTL = 0.5


def abandon(rt: Runtime, task_id: str, generation: int) -> None:
    """Claim a generation as a worker would, then die: the lease is never renewed."""
    claim_as_worker(rt, task_id, generation, "doomed-worker", TTL)


def new_task(rt: Runtime, n: int = 0) -> str:
    return rt.tasks.trigger(Trigger(task_type="simple", title=f"t{n}")).task.task_id


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Runtime:
    runtime, _ = runtime_for(store_url, tmp_path, max_recoveries=3)
    yield runtime  # type: ignore[misc]
    runtime.close()


def test_an_expired_lease_is_requeued_as_the_next_generation(rt: Runtime) -> None:
    task_id = new_task(rt)
    abandon(rt, task_id, 1)
    assert rt.sweeper.sweep().requeued == []  # still inside its lease
    time.sleep(TTL + 0.2)
    report = rt.sweeper.sweep()
    assert report.requeued == [(task_id, 1, 2)]
    view = rt.tasks.explain(task_id)
    assert (view["status"], view["generation"]) == ("queued", 2)
    assert [e["outcome"] for e in view["executions"]] == ["lost", None]
    assert rt.sweeper.sweep().requeued == []  # handled once


def test_a_held_lease_with_a_stale_mirror_is_not_requeued(rt: Runtime) -> None:
    task_id = new_task(rt)
    abandon(rt, task_id, 1)
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.lease_token is not None
    # The worker renewed in the lease back end, but its mirror write did not land.
    assert rt.leases.renew(task_lease(task_id), execution.lease_token, 30)
    time.sleep(TTL + 0.2)
    assert rt.sweeper.sweep().requeued == []
    assert rt.tasks.get(task_id).status == "running"


def test_two_sweepers_racing_requeue_each_expiry_once(
    rt: Runtime, store_url: str, tmp_path: Path
) -> None:
    other, _ = runtime_for(store_url, tmp_path, max_recoveries=3)
    try:
        task_ids = [new_task(rt, n) for n in range(20)]
        for task_id in task_ids:
            abandon(rt, task_id, 1)
        time.sleep(TTL + 0.2)
        reports = sweep_at_once(rt, other)
        requeued = [entry for report in reports for entry in report.requeued]
        assert sorted(requeued) == sorted((t, 1, 2) for t in task_ids)
        for task_id in task_ids:
            view = rt.tasks.explain(task_id)
            assert [e["generation"] for e in view["executions"]] == [1, 2]
    finally:
        other.close()


def test_the_recovery_cap_parks_the_task_as_failed(rt: Runtime) -> None:
    task_id = new_task(rt)
    for generation in (1, 2, 3):
        abandon(rt, task_id, generation)
        time.sleep(TTL + 0.2)
        rt.sweeper.sweep()
    task = rt.tasks.get(task_id)
    assert (task.status, task.failure_code, task.generation) == ("failed", "recovery_limit", 3)
    view = rt.tasks.explain(task_id)
    assert [e["outcome"] for e in view["executions"]] == ["lost", "lost", "lost"]


def propose_before_dying(rt: Runtime, task_id: str, generation: int) -> str:
    """The abandoned generation published a plan and proposed an action before it died."""
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    assert execution is not None
    assert execution.lease_token is not None
    fence = Fence(task_id, generation, execution.lease_token)
    # The first plan of a generation keeps the task's last plan: the node and its action id.
    with rt.db.transaction(readonly=True) as conn:
        before = task_plans.task_latest_plan(conn, task_id)
    nodes = before.nodes if before is not None else [node("fix", "waiting")]
    payload = plan_call("p", f"r{generation}", nodes)["arguments"]
    rt.plans.publish_execution_plan(execution.session_id, payload, fence=fence)
    proposal = ActionService(rt.db, rt.plans).propose(
        fence, execution.session_id, "fix", "work_order", {"crew": "north"}
    )
    return proposal.action.action_id


def action_status(rt: Runtime, action_id: str) -> tuple[str, str | None]:
    with rt.db.transaction(readonly=True) as conn:
        action = action_store.get_action(conn, action_id)
    assert action is not None
    return action.status, action.note


def test_requeueing_a_lost_generation_supersedes_its_pending_actions(rt: Runtime) -> None:
    task_id = new_task(rt)
    abandon(rt, task_id, 1)
    action_id = propose_before_dying(rt, task_id, 1)
    time.sleep(TTL + 0.2)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    status, note = action_status(rt, action_id)
    assert status == "superseded"
    assert note is not None
    assert "generation 1" in note
    assert rt.tasks.explain(task_id)["pending_actions"] == []
    assert rt.actions.list(task_id=task_id) == []


def test_parking_a_lost_generation_supersedes_its_pending_actions(rt: Runtime) -> None:
    task_id = new_task(rt)
    action_ids = []
    for generation in (1, 2, 3):
        abandon(rt, task_id, generation)
        action_ids.append(propose_before_dying(rt, task_id, generation))
        time.sleep(TTL + 0.2)
        rt.sweeper.sweep()
    assert rt.tasks.get(task_id).failure_code == "recovery_limit"
    assert [action_status(rt, a)[0] for a in action_ids] == ["superseded"] * 3
    assert rt.actions.list(task_id=task_id) == []


def test_a_queued_task_whose_wakeup_was_lost_is_republished_once(
    store_url: str, tmp_path: Path
) -> None:
    rt, dispatcher = runtime_for(store_url, tmp_path, queued_stale_seconds=0.3)
    try:
        task_id = new_task(rt)
        assert dispatcher.sent == [(task_id, 1)]
        assert rt.sweeper.sweep().republished == []
        time.sleep(0.4)
        assert rt.sweeper.sweep().republished == [(task_id, 1)]
        assert rt.sweeper.sweep().republished == []  # not again until it is stale again
        assert dispatcher.sent == [(task_id, 1), (task_id, 1)]
        # Marked as sent again: its worker reads the store before it takes the lease (the
        # first wake-up may yet claim it); the trigger's own wake-up is not.
        assert dispatcher.sent_again == [(task_id, 1)]
    finally:
        rt.close()


def test_a_requeue_announces_the_end_of_the_lost_generation(rt: Runtime) -> None:
    """A worker still running it (paused, cut off) hears at once (services/generation_watch)."""
    announced: list[str] = []
    rt.db.after_commit = announced.extend
    task_id = new_task(rt)
    abandon(rt, task_id, 1)
    time.sleep(TTL + 0.2)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    assert ended_key(task_id) in announced


class _BrokerAway:
    """A broker that takes no wake-up, counting those it was asked to take."""

    def __init__(self) -> None:
        self.asked = 0

    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        self.asked += 1
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")


def test_wake_ups_redis_lost_are_sent_again_a_bounded_number_a_sweep(
    store_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A sweep that finds its mark in Redis gone sends the wake-up of every queued task again.
    It sent them all in that one sweep, one transaction and one publish each, however many
    (the recovery of expired leases waited behind them), and with the broker away it tried
    every one, a warning line each. Now two batches a sweep, the rest at the next sweeps, each
    once, and the first wake-up the broker does not take ends the sweep's sends."""
    from orchestrator.leases.redis import RedisLeaseBackend
    from orchestrator.services.sweeper import Sweeper

    rt, _ = runtime_for(store_url, tmp_path, queued_stale_seconds=600)
    leases = RedisLeaseBackend.from_url(redis_url)
    try:
        tasks = {new_task(rt, n) for n in range(7)}
        settings = rt.settings.model_copy(update={"redis_url": redis_url})
        away = _BrokerAway()
        assert Sweeper(settings, rt.db, leases, away, batch=2).sweep().republished == []
        assert away.asked == 1  # the mark was new: every task, but not one failure a task
        dispatcher = RecordingDispatcher()
        sweeper = Sweeper(settings, rt.db, leases, dispatcher, batch=2)
        mark = leases.get(BROKER_MARK)
        assert mark is not None
        leases.release(BROKER_MARK, mark.token)  # Redis lost its data
        sent = [sweeper.sweep().republished for _ in range(4)]
        # Two batches of 2 (LOST_WAKE_UP_BATCHES), then the 3 left (a batch, then a short one).
        assert [len(wake_ups) for wake_ups in sent] == [4, 3, 0, 0]
        assert sorted(t for t, _ in dispatcher.sent) == sorted(tasks)
    finally:
        leases.close()
        rt.close()


def test_a_restarted_sweeper_keeps_the_mark_and_sends_nothing_again(
    store_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper keeps its mark in Redis to see that Redis lost its data. Restarted (a deploy)
    or taking over from a stopped one, it could not renew the mark the other had made (a lease
    of the other's token): once that ran out, an hour later, it took it for Redis's data lost
    and sent every queued task's wake-up again. The mark here lasts 1 s instead of an hour;
    the new sweeper keeps it, and sends nothing. (At 0.3 s, load 10 held a sweep past the mark's
    end in a full run: a mark that ran out between two sweeps is Redis's data lost, rightly.)"""
    from orchestrator.leases.redis import RedisLeaseBackend
    from orchestrator.services import sweeper as sweeper_module

    monkeypatch.setattr(sweeper_module, "BROKER_MARK_SECONDS", 1.0)
    rt, _ = runtime_for(store_url, tmp_path, queued_stale_seconds=600)
    leases = RedisLeaseBackend.from_url(redis_url)
    try:
        task_id = new_task(rt)
        settings = rt.settings.model_copy(update={"redis_url": redis_url})
        first = sweeper_module.Sweeper(settings, rt.db, leases, RecordingDispatcher())
        assert first.sweep().republished == [(task_id, 1)]  # a new Redis: no mark yet
        dispatcher = RecordingDispatcher()
        restarted = sweeper_module.Sweeper(settings, rt.db, leases, dispatcher)
        ends = time.monotonic() + 3.0  # past the first sweeper's mark, three times over
        while time.monotonic() < ends:
            restarted.sweep()
            time.sleep(0.05)  # the sweep interval
        assert dispatcher.sent == []
        assert leases.get(BROKER_MARK) is not None
    finally:
        leases.close()
        rt.close()
