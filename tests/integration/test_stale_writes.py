"""Late writes of a superseded generation, on real Postgres: each is refused, nothing is written.

The agent normally stops on its own (a failed renewal, the keeper's safety margin); these tests
play the zombie that did not notice: its keeper still thinks the lease is fresh, so the store's
fence, checked in the write's own transaction, is the only thing between it and the task.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestrator.domain.decisions import Decision
from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.executions import RunResult
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.round_end import decide_round, finish_generation, fixed
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import tasks as task_store
from orchestrator.store.tables import actions, evidence, plan_revisions, reports, sessions
from orchestrator.tools.actions import ProposeAction
from orchestrator.tools.base import ToolContext
from orchestrator.tools.tasks import SaveReport
from tests.executions_support import (
    claim_as_worker,
    completing_turns,
    fenced_ctx,
    node,
    plan_call,
    runtime_for,
    wait_for,
    write_script,
)

TTL = 0.5


@pytest.fixture
def rt(pg_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts)
    yield runtime
    runtime.close()


@dataclass(frozen=True)
class Zombie:
    """A generation that was superseded but still holds its fence and session."""

    fence: Fence
    session_id: str

    def ctx(self) -> ToolContext:
        return fenced_ctx(self.fence, self.session_id)


def session_of(rt: Runtime, task_id: str, generation: int) -> str:
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    assert execution is not None
    return execution.session_id


def fresh_keeper(rt: Runtime, fence: Fence) -> LeaseKeeper:
    """A keeper that believes its lease is fresh (never started, so it never renews)."""
    return LeaseKeeper(rt.leases, rt.db, fence, holder="w1", ttl=60, renew_every=20)


def plan_payload(request_id: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(plan_call("p", request_id, nodes)["arguments"])


def claim_and_plan(rt: Runtime, ttl: float) -> Zombie:
    """Trigger a task and claim generation 1 as a worker would, with a first plan revision."""
    task_id = rt.tasks.trigger(Trigger(task_type="zombie", title="Turbid water")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "zombie-worker", ttl)
    zombie = Zombie(Fence(task_id, 1, token), session_of(rt, task_id, 1))
    rt.plans.publish_execution_plan(
        zombie.session_id,
        plan_payload("r1", [node("a", "running"), node("b", "pending")]),
        fence=zombie.fence,
    )
    return zombie


def supersede(rt: Runtime, zombie: Zombie, how: str) -> None:
    task_id = zombie.fence.task_id
    if how == "requeue":
        assert rt.tasks.requeue(task_id, "operator wants a fresh look").generation == 2
    elif how == "cancel":
        assert rt.tasks.cancel(task_id).status == "cancelled"
    else:  # the worker stalled past its lease; the sweeper declares it lost
        time.sleep(TTL + 0.3)
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]


def snapshot(rt: Runtime, task_id: str, generation: int | None = None) -> dict[str, Any]:
    """Everything an execution's writes could touch, for this task (or one of its generations)."""
    task_sessions = select(sessions.c.session_id).where(sessions.c.task_id == task_id)
    if generation is not None:
        task_sessions = task_sessions.where(sessions.c.generation == generation)

    def count(table: Any) -> int:
        query = select(func.count()).select_from(table).where(table.c.task_id == task_id)
        if generation is not None:
            query = query.where(table.c.generation == generation)
        with rt.db.transaction(readonly=True) as conn:
            return int(conn.execute(query).scalar_one())

    with rt.db.transaction(readonly=True) as conn:
        task = task_store.get_task(conn, task_id)
        assert task is not None
        revisions = int(
            conn.execute(
                select(func.count())
                .select_from(plan_revisions)
                .where(plan_revisions.c.session_id.in_(task_sessions))
            ).scalar_one()
        )
        # Not the mirrored lease expiry: a live generation's heartbeat moves it.
        executions = [
            (e.generation, e.outcome, e.reason, e.failure_code, e.ended_at, e.lease_token)
            for e in execution_store.list_executions(conn, task_id)
            if generation is None or e.generation == generation
        ]
    return {
        "task": (
            task.status,
            task.generation,
            task.failure_code,
            task.last_error,
            task.rounds,
            task.recoveries,
            task.session_id,
        ),
        "executions": executions,
        "reports": count(reports),
        "evidence": count(evidence),
        "actions": count(actions),
        "plan_revisions": revisions,
    }


def late_report(rt: Runtime, zombie: Zombie) -> None:
    tool = SaveReport(rt.db, fresh_keeper(rt, zombie.fence))
    args = tool.arguments.model_validate(
        {"summary": "late findings", "findings": ["stale"], "outcome": "continue"}
    )
    tool.run(zombie.ctx(), args)


def late_action(rt: Runtime, zombie: Zombie) -> None:
    tool = ProposeAction(ActionService(rt.db, rt.plans), fresh_keeper(rt, zombie.fence))
    args = tool.arguments.model_validate(
        {"node_id": "a", "kind": "work_order", "payload": {"crew": "flush the main"}}
    )
    tool.run(zombie.ctx(), args)


def late_plan(rt: Runtime, zombie: Zombie) -> None:
    payload = plan_payload("late", [node("a", "completed"), node("b", "completed")])
    rt.plans.publish_execution_plan(zombie.session_id, payload, fence=zombie.fence)


def late_finish(decision: Decision | None) -> Callable[[Runtime, Zombie], None]:
    """The final status write; `None` judges the round by the real decision table."""

    def write(rt: Runtime, zombie: Zombie) -> None:
        judged: list[Any] = []

        def rule(facts: Any) -> Decision:
            judged.append(facts)
            if decision is not None:
                return fixed(decision)(facts)
            return decide_round(facts, max_rounds=5, turn_budget_spent=False)

        try:
            finish_generation(rt.db, zombie.fence, rule)
        except StaleGeneration:
            assert judged == []  # refused before any fact was read or judged
            raise

    return write


LATE_WRITES: dict[str, Callable[[Runtime, Zombie], None]] = {
    "save_report": late_report,
    "propose_action": late_action,
    "publish_plan": late_plan,
    "finish_completed": late_finish(
        Decision(
            "completed", "completed", "every plan node is done (1 completed) and a report was saved"
        )
    ),
    "finish_continue": late_finish(Decision("queued", "continue", "plan nodes remain open")),
    "finish_failed": late_finish(Decision("failed", "failed", "agent error", "agent_error")),
    "finish_waiting": late_finish(Decision("waiting", "waiting", "1 action(s) await approval")),
    "finish_by_the_table": late_finish(None),
}


def test_the_zombie_can_write_before_it_is_superseded(rt: Runtime) -> None:
    """The control: the same writes from the live generation are applied."""
    zombie = claim_and_plan(rt, ttl=60)
    late_action(rt, zombie)
    late_report(rt, zombie)
    after = snapshot(rt, zombie.fence.task_id)
    assert (after["actions"], after["reports"], after["plan_revisions"]) == (1, 1, 2)
    late_finish(Decision("completed", "completed", "done"))(rt, zombie)
    assert rt.tasks.get(zombie.fence.task_id).status == "completed"


@pytest.mark.parametrize("how", ["requeue", "cancel", "lost"])
@pytest.mark.parametrize("write", list(LATE_WRITES))
def test_a_late_write_of_a_superseded_generation_is_refused_and_writes_nothing(
    rt: Runtime, how: str, write: str
) -> None:
    zombie = claim_and_plan(rt, ttl=TTL if how == "lost" else 60)
    supersede(rt, zombie, how)
    before = snapshot(rt, zombie.fence.task_id)
    with pytest.raises(StaleGeneration) as caught:
        LATE_WRITES[write](rt, zombie)
    assert caught.value.code == "stale_generation"
    assert snapshot(rt, zombie.fence.task_id) == before
    expected_outcome = {"requeue": "superseded", "cancel": "cancelled", "lost": "lost"}[how]
    assert before["executions"][0][1] == expected_outcome


def _running_fence(rt: Runtime, task_id: str, generation: int) -> Fence:
    def lookup() -> Fence | None:
        with rt.db.transaction(readonly=True) as conn:
            execution = execution_store.get_execution(conn, task_id, generation)
        if execution is None or execution.lease_token is None:
            return None
        return Fence(task_id, generation, execution.lease_token)

    fence: Fence = wait_for(lookup, timeout=10, what=f"generation {generation} to start")
    return fence


def _first_revision(rt: Runtime, session_id: str) -> None:
    def published() -> bool:
        with rt.db.transaction(readonly=True) as conn:
            return bool(
                conn.execute(
                    select(func.count())
                    .select_from(plan_revisions)
                    .where(plan_revisions.c.session_id == session_id)
                ).scalar_one()
            )

    wait_for(published, timeout=10, what="the first plan revision")


def test_late_writes_while_the_next_generation_runs_are_refused(rt: Runtime, scripts: Path) -> None:
    """Real rounds: generation 1 is requeued mid-round, then writes while generation 2 runs."""
    write_script(scripts, "zombie", completing_turns(delay_s=2.0))
    task_id = rt.tasks.trigger(Trigger(task_type="zombie", title="Turbid water")).task.task_id
    first: list[RunResult] = []
    worker1 = threading.Thread(
        target=lambda: first.append(rt.executions.run(task_id, 1, worker="w1"))
    )
    worker1.start()
    old = Zombie(_running_fence(rt, task_id, 1), session_of(rt, task_id, 1))
    _first_revision(rt, old.session_id)
    assert rt.tasks.requeue(task_id, "operator wants a fresh look").generation == 2
    worker1.join(timeout=30)
    assert first
    assert first[0].outcome is None

    second: list[RunResult] = []
    worker2 = threading.Thread(
        target=lambda: second.append(rt.executions.run(task_id, 2, worker="w2"))
    )
    worker2.start()
    try:
        new = _running_fence(rt, task_id, 2)
        assert new.lease_token != old.fence.lease_token
        _first_revision(rt, session_of(rt, task_id, 2))
        before = snapshot(rt, task_id, generation=1)
        assert before["task"][:2] == ("running", 2)
        assert snapshot(rt, task_id)["actions"] == 0
        for name in ("save_report", "propose_action", "publish_plan", "finish_completed"):
            with pytest.raises(StaleGeneration) as caught:
                LATE_WRITES[name](rt, old)
            assert caught.value.code == "stale_generation", name
        assert snapshot(rt, task_id, generation=1) == before
        assert snapshot(rt, task_id)["actions"] == 0
    finally:
        worker2.join(timeout=30)
    assert second
    assert second[0].outcome == "completed"
    view = rt.tasks.explain(task_id)
    assert view["status"] == "completed"
    assert [e["outcome"] for e in view["executions"]] == ["superseded", "completed"]
    assert view["report"]["summary"] == "round ended completed"  # generation 2's, not the zombie's
    assert view["pending_actions"] == []
    assert view["plan"]["revision"] == 2
