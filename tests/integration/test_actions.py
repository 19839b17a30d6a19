"""Actions: proposed only for a saved plan node, written back to it, decided only by a human."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.domain.fences import Fence
from orchestrator.errors import InvalidTransition
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import actions as action_store
from orchestrator.store import generations as generation_store
from orchestrator.store import reports as report_store
from orchestrator.store import tasks as task_store
from tests.executions_support import (
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)


def propose(call_id: str, node_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "propose_action",
        "arguments": {"node_id": node_id, "kind": "work_order", "payload": {"crew": "north"}},
    }


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts")
    yield runtime
    runtime.close()


def run_script(rt: Runtime, tmp_path: Path, turns: list[dict[str, Any]]) -> str:
    write_script(tmp_path / "scripts", "act", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="act", title="Burst main")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").ran
    return task_id


def test_a_proposed_action_waits_and_its_id_is_written_back_to_the_node(
    rt: Runtime, tmp_path: Path
) -> None:
    nodes = [node("check", "completed"), node("repair", "waiting")]
    task_id = run_script(
        rt,
        tmp_path,
        [
            {"tool_calls": [query_call()]},
            {"tool_calls": [plan_call("c1", "r1", nodes)]},
            {"tool_calls": [propose("c2", "repair")]},
            {"tool_calls": [propose("c3", "repair")]},  # a repeat returns the same action
            {"tool_calls": [report_call("c4", "completed")]},
        ],
    )
    view = rt.tasks.explain(task_id)
    assert view["status"] == "waiting"
    assert len(view["pending_actions"]) == 1
    action_id = view["pending_actions"][0]["action_id"]
    repair = next(n for n in view["plan"]["nodes"] if n["id"] == "repair")
    assert repair["action_id"] == action_id
    assert view["plan"]["revision"] == 2
    digest = rt.actions.get(action_id).digest
    decided = rt.actions.decide(
        action_id, approve=True, by="duty engineer", note="go", digest=digest
    )
    assert (decided.status, decided.decided_by) == ("approved", "duty engineer")
    with pytest.raises(InvalidTransition):
        rt.actions.decide(action_id, approve=False, by="someone", note=None)


def test_an_action_for_a_node_not_in_the_saved_plan_is_refused_and_writes_nothing(
    rt: Runtime, tmp_path: Path
) -> None:
    task_id = run_script(
        rt,
        tmp_path,
        [
            {"tool_calls": [plan_call("c1", "r1", [node("check", "running")])]},
            {"tool_calls": [propose("c2", "repair")]},
            {"tool_calls": [report_call("c3", "failed")]},  # ends the task in this generation
        ],
    )
    view = rt.tasks.explain(task_id)
    assert view["pending_actions"] == []
    assert view["plan"]["revision"] == 1


def test_the_agent_has_no_tool_that_executes_an_action(rt: Runtime, tmp_path: Path) -> None:
    task_id = run_script(rt, tmp_path, [{"content": "nothing"}])
    assert task_id
    from orchestrator.services.lease_keeper import LeaseKeeper

    tools = rt.executions._tools(LeaseKeeper.__new__(LeaseKeeper))
    names = {tool.name for tool in tools}
    assert {"read_task_context", "publish_execution_plan", "propose_action", "save_report"} <= names
    # Without a gateway or the command tool configured, nothing can write outside the store.
    assert all(tool.effect in ("read", "internal_write") for tool in tools), names
    assert not any("execute" in name and name != "execute_command" for name in names)


def test_actions_over_http(rt: Runtime, tmp_path: Path, store_url: str) -> None:
    nodes = [node("repair", "waiting")]
    task_id = run_script(
        rt,
        tmp_path,
        [{"tool_calls": [plan_call("c1", "r1", nodes)]}, {"tool_calls": [propose("c2", "repair")]}],
    )
    app = create_app(load_settings(database_url=store_url))
    with TestClient(app) as client:
        listed = client.get("/api/v1/actions", params={"task_id": task_id}).json()["items"]
        assert len(listed) == 1
        action_id = listed[0]["action_id"]
        assert client.post(f"/api/v1/actions/{action_id}/approve", json={}).status_code == 422
        approved = client.post(f"/api/v1/actions/{action_id}/reject", json={"by": "ops"})
        assert approved.status_code == 200
        assert approved.json()["status"] == "rejected"
        digest = client.get(f"/api/v1/actions/{action_id}").json()["digest"]
        again = client.post(
            f"/api/v1/actions/{action_id}/approve", json={"by": "ops", "digest": digest}
        )
        assert (again.status_code, again.json()["error"]["code"]) == (409, "already_decided")
        missing = client.post("/api/v1/actions/nope/approve", json={"by": "ops", "digest": digest})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_pending_actions_of_generation_lists_only_that_generation(rt: Runtime) -> None:
    """The explain view's query: an earlier generation's leftover proposal is not current."""
    task_id = rt.tasks.trigger(Trigger(task_type="act", title="Burst main")).task.task_id
    with rt.db.transaction() as conn:
        task = task_store.get_task(conn, task_id, lock=True)
        assert task is not None
        assert task.session_id is not None
        old = action_store.insert_action(
            conn, Fence(task_id, 1, "t1"), task.session_id, "repair", "work_order", {}
        )
        # Moved on without superseding it (as lost-lease recovery used to).
        assert generation_store.requeue_generation(
            conn,
            task.task_id,
            task.generation,
            title=task.title,
            from_statuses=("queued",),
            recoveries=0,
            rounds=0,
        )
        current = task_store.get_task(conn, task_id)
        assert current is not None
        assert current.session_id is not None
        new = action_store.insert_action(
            conn, Fence(task_id, 2, "t2"), current.session_id, "repair", "command", {}
        )
    with rt.db.transaction(readonly=True) as conn:
        listed = report_store.pending_actions_of_generation(conn, task_id, 2)
        first = report_store.pending_actions_of_generation(conn, task_id, 1)
        every = report_store.pending_actions_of(conn, task_id)
    assert [(a["action_id"], a["generation"]) for a in listed] == [(new.action_id, 2)]
    assert [a["action_id"] for a in first] == [old.action_id]
    assert {a["action_id"] for a in every} == {old.action_id, new.action_id}
