"""The business backend hears of every action that goes away, and of approved work orders whose
task is cancelled: `action_superseded` and `action_task_cancelled` webhooks, written in the
transaction of the change they report. Both stores.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from orchestrator.domain.fences import Fence
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import driver, outbox_sending, outbox_views
from orchestrator.store import generations as generation_store
from orchestrator.store import task_events as event_store
from orchestrator.store.types import utcnow
from tests.executions_support import (
    claim_as_worker,
    insert_running,
    node,
    plan_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.outbox_support import Recorder, running_recorder, waiting_task


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts")
    yield runtime
    runtime.close()


def events(rt: Runtime, task_id: str) -> list[str]:
    with rt.db.transaction(readonly=True) as conn:
        return [e.type for e in event_store.events_after(conn, task_id, 0, 100)]


def hooks(rt: Runtime, task_id: str, event_type: str) -> list[dict[str, Any]]:
    """The webhook bodies of `event_type` the outbox holds for the task, oldest first."""
    with rt.db.transaction(readonly=True) as conn:
        rows = outbox_views.list_rows(conn, task_id=task_id, kind="webhook")
    bodies = [json.loads(row.body) for row in rows]
    return [body for body in bodies if body["type"] == event_type]


def propose(call_id: str, crew: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "propose_action",
        "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": crew}},
    }


def first_round(rt: Runtime, tmp_path: Path, turns: list[Any], outcome: str) -> str:
    """A task whose generation 1 plays `turns` and ends with `outcome`: its id."""
    write_script(tmp_path / "scripts", "act", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="act", title="Burst main")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == outcome
    return task_id


def test_a_new_digest_for_the_node_sends_action_superseded_for_the_old_proposal(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id = first_round(
        rt,
        tmp_path,
        [
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {"tool_calls": [propose("c2", "north")]},
            {"tool_calls": [propose("c3", "south")]},
            {"tool_calls": [report_call("c4", "waiting")]},
        ],
        "waiting",
    )
    first, second = sorted(
        rt.actions.list(task_id=task_id, status=None), key=lambda a: a.created_at
    )
    assert (first.status, second.status) == ("superseded", "pending_approval")
    kinds = [e for e in events(rt, task_id) if e.startswith("action_")]
    assert kinds == ["action_proposed", "action_superseded", "action_proposed"]
    [hook] = hooks(rt, task_id, "action_superseded")
    assert hook["action"]["action_id"] == first.action_id
    assert hook["action"]["status"] == "superseded"
    assert second.action_id in hook["action"]["note"]


@pytest.mark.parametrize(
    ("move", "final"),
    [("requeue", "queued"), ("cancel", "cancelled")],
)
def test_an_operator_requeue_or_cancel_sends_action_superseded_before_the_status(
    rt: Runtime, tmp_path: Path, move: str, final: str
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    if move == "requeue":
        rt.tasks.requeue(task_id, "look again")
    else:
        rt.tasks.cancel(task_id, "not ours")
    assert events(rt, task_id)[-2:] == ["action_superseded", final]
    [hook] = hooks(rt, task_id, "action_superseded")
    assert (hook["action"]["action_id"], hook["action"]["status"]) == (action_id, "superseded")
    assert hook["generation"] == 1  # the action's generation, whatever the task moved to


def test_a_failed_round_sends_action_superseded_in_the_statement_that_settles_it(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id = first_round(
        rt,
        tmp_path,
        [
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {"tool_calls": [propose("c2", "north")]},
            {"tool_calls": [report_call("c3", "failed")]},
        ],
        "failed",
    )
    (action,) = rt.actions.list(task_id=task_id, status=None)
    assert action.status == "superseded"
    assert events(rt, task_id)[-2:] == ["action_superseded", "failed"]
    [hook] = hooks(rt, task_id, "action_superseded")
    assert hook["action"]["action_id"] == action.action_id
    assert hook["reason"].startswith("work_order")
    assert "the task failed" in hook["action"]["note"]


def test_a_lost_generation_sends_action_superseded_before_the_requeue(
    store_url: str, tmp_path: Path
) -> None:
    rt, _ = runtime_for(store_url, tmp_path / "scripts", max_recoveries=3)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
        token = claim_as_worker(rt, task_id, 1, "doomed-worker", 0.3)
        session_id = rt.tasks.get(task_id).session_id
        assert session_id is not None
        fence = Fence(task_id, 1, token)
        payload = plan_call("p", "r1", [node("fix", "waiting")])["arguments"]
        rt.plans.publish_execution_plan(session_id, payload, fence=fence)
        proposal = ActionService(rt.db, rt.plans).propose(
            fence, session_id, "fix", "work_order", {"crew": "north"}
        )
        time.sleep(0.5)
        assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
        assert events(rt, task_id)[-2:] == ["action_superseded", "queued"]
        [hook] = hooks(rt, task_id, "action_superseded")
        assert hook["action"]["action_id"] == proposal.action.action_id
        assert "lost its lease" in hook["action"]["note"]
    finally:
        rt.close()


def test_ending_a_round_with_nothing_to_supersede_costs_no_extra_statement(rt: Runtime) -> None:
    """The end of a finished task's round supersedes its pending actions in the statement that
    settles it (Postgres); the notice of what it superseded costs statements only when there
    is something to supersede."""
    task_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    with rt.db.transaction() as conn:
        insert_running(
            conn,
            [(task_id, session_id, "token")],
            task_type="t",
            worker="w",
            lease_expires_at=utcnow() + timedelta(seconds=60),
        )
    counted: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        counted.append(statement)

    def count_driver(statement: str, _autocommit: bool) -> None:
        counted.append(statement)  # what store.driver sends past SQLAlchemy's events

    def end(note: str | None) -> int:
        counted.clear()
        with rt.db.transaction() as conn:
            event.listen(conn, "before_cursor_execute", count)
            driver.observers.append(count_driver)
            generation_store.end_and_settle(
                conn,
                task_id,
                1,
                outcome="completed",
                reason="done",
                failure_code=None,
                status="completed",
                last_error=None,
                rounds=1,
                supersede_note=note,
            )
            event.remove(conn, "before_cursor_execute", count)
            driver.observers.remove(count_driver)
        return len(counted)

    # SQLite has no data-modifying WITH: its supersede is a statement of its own, as before.
    extra = 0 if rt.db.dialect == "postgresql" else 1
    assert end(None) == 2 + extra * 1  # end the generation (and settle), running receipts
    assert end("the task completed") == end(None) + extra
    assert events(rt, task_id) == []


def test_a_cancel_after_an_approval_tells_the_backend_and_still_delivers_the_work_order(
    store_url: str, tmp_path: Path
) -> None:
    with running_recorder() as backend:
        rt, _ = runtime_for(
            store_url,
            tmp_path / "scripts",
            actions_url=f"{backend.url}/actions",
            actions_secret="a",
            webhook_url=f"{backend.url}/hooks",
            webhook_secret="s",
        )
        try:
            _cancel_after_approval(rt, tmp_path, backend)
        finally:
            rt.close()


def _cancel_after_approval(rt: Runtime, tmp_path: Path, backend: Recorder) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="alma", note="go", digest=digest)
    assert rt.tasks.get(task_id).status == "queued"  # the approval queued generation 2
    rt.tasks.cancel(task_id, "the complaint was withdrawn")
    assert events(rt, task_id)[-2:] == ["action_task_cancelled", "cancelled"]
    assert rt.actions.get(action_id).status == "approved"  # nothing is un-decided
    [notice] = hooks(rt, task_id, "action_task_cancelled")
    assert notice["action"]["action_id"] == action_id
    assert notice["action"]["status"] == "approved"
    assert notice["action"]["delivery"] == "pending"  # cancelled before it was sent
    assert "the complaint was withdrawn" in notice["reason"]
    sender = OutboxDispatcher(rt.settings, rt.db)
    try:
        sender.run_once()
    finally:
        sender.close()
    [delivery] = backend.on("/actions")  # the approval still reaches the backend, once
    assert delivery.body["action_id"] == action_id
    sent = [h.body["type"] for h in backend.on("/hooks")]
    assert sent[-2:] == ["action_task_cancelled", "cancelled"]


def test_a_cancel_names_an_approval_already_delivered_as_delivered(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest
    rt.actions.decide(action_id, approve=True, by="alma", note=None, digest=digest)
    with rt.db.transaction() as conn:
        [row] = outbox_views.list_rows(conn, task_id=task_id, kind="action")
        outbox_sending.mark_delivered(conn, row.outbox_id)
    rt.tasks.cancel(task_id)
    [notice] = hooks(rt, task_id, "action_task_cancelled")
    assert (notice["action"]["action_id"], notice["action"]["delivery"]) == (action_id, "delivered")


def test_a_cancel_without_approved_actions_sends_no_notice(rt: Runtime, tmp_path: Path) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    rt.actions.decide(action_id, approve=False, by="alma", note="no")
    rt.tasks.cancel(task_id)
    assert "action_task_cancelled" not in events(rt, task_id)
