"""Invariant 10 under concurrency (Postgres): a publish or proposal that waited on the task row
lock while the report committed is refused, not applied after the report.

The calls of one turn may run concurrently, so a model that saves its report and publishes in
the same turn produces exactly this race.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.domain.vocabulary import ACTION_KINDS
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store.fencing import check_fence
from orchestrator.store.reports import ReportAlreadySaved
from tests.executions_support import claim_as_worker, node, plan_call, runtime_for


@pytest.fixture
def rt(pg_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts)
    yield runtime
    runtime.close()


def running_generation(rt: Runtime) -> tuple[Fence, str]:
    task_id = rt.tasks.trigger(Trigger(task_type="race", title="Pump vibration")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "racer", 30)
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    fence = Fence(task_id, 1, token)
    payload = dict(plan_call("p", "r1", [node("a", "running", actor="human")])["arguments"])
    rt.plans.publish_execution_plan(execution.session_id, payload, fence=fence)
    return fence, execution.session_id


def report_commits_while(
    rt: Runtime, fence: Fence, session_id: str, write: Callable[[], Any]
) -> None:
    """Hold the task row with an uncommitted report while `write` runs; `write` must wait."""
    locked, release = threading.Event(), threading.Event()

    def save_report() -> None:
        with rt.db.transaction() as conn:
            check_fence(conn, fence)
            report_store.insert_report(
                conn,
                fence,
                session_id,
                summary="s",
                findings=[],
                evidence_refs=[],
                outcome="waiting",
            )
            locked.set()
            release.wait(10)

    saver = threading.Thread(target=save_report)
    saver.start()
    assert locked.wait(10)
    outcome: list[BaseException | None] = []

    def run_write() -> None:
        try:
            write()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    writer = threading.Thread(target=run_write)
    writer.start()
    time.sleep(0.3)
    assert writer.is_alive(), "the write did not wait for the task row lock"
    release.set()
    saver.join(10)
    writer.join(10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], ReportAlreadySaved)


def test_a_publish_that_waited_for_the_report_is_refused(rt: Runtime) -> None:
    fence, session_id = running_generation(rt)
    payload = dict(plan_call("p", "r2", [node("a", "completed", actor="human")])["arguments"])
    report_commits_while(
        rt,
        fence,
        session_id,
        lambda: rt.plans.publish_execution_plan(session_id, payload, fence=fence),
    )
    with rt.db.transaction(readonly=True) as conn:
        assert plan_store.latest_revision_number(conn, session_id) == 1


def test_a_proposal_that_waited_for_the_report_is_refused(rt: Runtime) -> None:
    fence, session_id = running_generation(rt)
    actions = ActionService(rt.db, rt.plans)
    report_commits_while(
        rt,
        fence,
        session_id,
        lambda: actions.propose(fence, session_id, "a", ACTION_KINDS[0], {"device": "pump-2"}),
    )
