"""Approvals bound to a digest and a plan node, decided once, and a decision moves the task."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.domain.approvals import action_digest
from orchestrator.errors import ConflictError, OrchestratorError
from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import outbox_views
from orchestrator.store import task_events as event_store
from tests.executions_support import (
    kept_node,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
)

PAYLOAD = {"crew": "north", "valve": "V-12"}


def propose(call_id: str, node_id: str = "repair") -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "propose_action",
        "arguments": {"node_id": node_id, "kind": "work_order", "payload": PAYLOAD},
    }


def write(scripts: Path, turns: list[dict[str, Any]], *, record: bool = True) -> Path:
    scripts.mkdir(parents=True, exist_ok=True)
    path = scripts / "wo.json"
    path.write_text(json.dumps({"turns": turns, "record_requests": record}), encoding="utf-8")
    return path


READ = {"tool_calls": [{"id": "c0", "name": "read_task_context", "arguments": {}}, query_call()]}
WAITING_ROUND = [
    READ,
    {
        "tool_calls": [
            plan_call("c1", "r1", [node("check", "completed"), node("repair", "waiting")])
        ]
    },
    {"tool_calls": [propose("c2")]},
    {"tool_calls": [report_call("c3", "waiting")]},
]
COMPLETING_ROUND = [
    READ,
    {
        "tool_calls": [
            plan_call(
                "c1",
                "r1",
                # Generation 2 keeps the checked node as it was and the repair's action id.
                [
                    kept_node(0),
                    node("repair", "completed", evidence="approved")
                    | {"action_id": "${c0.result.previous_generation.plan.nodes.1.action_id}"},
                ],
                edges=[{"from": "check", "to": "repair"}],
            )
        ]
    },
    {"tool_calls": [report_call("c2", "completed")]},
]


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, RecordingDispatcher, Path]]:
    runtime, dispatcher = runtime_for(store_url, tmp_path / "scripts")
    yield runtime, dispatcher, tmp_path / "scripts"
    runtime.close()


def waiting_task(rt: Runtime, scripts: Path) -> tuple[str, str]:
    write(scripts, WAITING_ROUND)
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    (action,) = rt.actions.list(task_id=task_id)
    return task_id, action.action_id


def task_context_seen(scripts: Path) -> dict[str, Any]:
    """The last read_task_context result a scripted model was given."""
    lines = (scripts / "wo.json.requests.jsonl").read_text(encoding="utf-8").splitlines()
    for line in reversed(lines):
        for message in reversed(json.loads(line)["messages"]):
            if message["role"] == "tool" and message["tool_call_id"] == "c0":
                return dict(json.loads(message["content"])["result"])
    raise AssertionError("no read_task_context result was recorded")


def test_an_action_shows_its_digest_and_the_plan_revision_it_was_proposed_under(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    _, action_id = waiting_task(rt, scripts)
    action = rt.actions.get(action_id)
    assert action.digest == action_digest("work_order", PAYLOAD)
    assert len(action.digest) == 64
    assert action.plan_revision == 1  # the saved plan that had the node; revision 2 names it


def test_approval_with_its_digest_queues_the_next_generation_which_sees_it_and_completes(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, dispatcher, scripts = env
    task_id, action_id = waiting_task(rt, scripts)
    digest = rt.actions.get(action_id).digest
    with pytest.raises(ConflictError) as stale:
        rt.actions.decide(action_id, approve=True, by="ana", note=None, digest="0" * 64)
    assert stale.value.code == "stale_approval"
    assert rt.tasks.get(task_id).status == "waiting"  # a refused decision changes nothing

    decided = rt.actions.decide(action_id, approve=True, by="ana", note="crew ready", digest=digest)
    assert (decided.status, decided.decided_by, decided.note) == ("approved", "ana", "crew ready")
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation, task.intent_round) == ("queued", 2, 1)
    assert dispatcher.sent[-1] == (task_id, 2)

    write(scripts, COMPLETING_ROUND)
    assert rt.executions.run(task_id, 2, worker="w").outcome == "completed"
    seen = task_context_seen(scripts)
    assert seen["generation"] == 2
    (action,) = seen["actions"]
    assert action["action_id"] == action_id
    assert (action["node_id"], action["status"], action["decision"]) == (
        "repair",
        "approved",
        "approved",
    )
    assert (action["approver"], action["note"], action["digest"]) == ("ana", "crew ready", digest)


def test_rejection_is_seen_and_a_reproposal_returns_the_rejected_action(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    task_id, action_id = waiting_task(rt, scripts)
    rt.actions.decide(action_id, approve=False, by="ben", note="not this valve")
    assert rt.tasks.get(task_id).status == "queued"
    # The same script again: it re-proposes the same work order, which returns the rejected
    # action instead of a new pending one, so the task does not wait on it again.
    outcome = rt.executions.run(task_id, 2, worker="w").outcome
    assert outcome == "continue"
    actions = rt.actions.list(task_id=task_id, status=None)
    assert [(a.action_id, a.status, a.note) for a in actions] == [
        (action_id, "rejected", "not this valve")
    ]
    seen = task_context_seen(scripts)
    assert [(a["status"], a["approver"]) for a in seen["actions"]] == [("rejected", "ben")]


def test_a_decision_is_made_once_and_a_superseded_action_is_stale(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    _, action_id = waiting_task(rt, scripts)
    digest = rt.actions.get(action_id).digest
    results: list[str] = []

    def decide(approve: bool) -> None:
        try:
            rt.actions.decide(action_id, approve=approve, by="x", note=None, digest=digest)
            results.append("ok")
        except OrchestratorError as exc:
            results.append(exc.code)

    threads = [threading.Thread(target=decide, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == ["already_decided"] * 3 + ["ok"]

    other_task, other_action = waiting_task(rt, scripts)
    rt.tasks.requeue(other_task, "start over")
    with pytest.raises(ConflictError) as stale:
        rt.actions.decide(
            other_action,
            approve=True,
            by="x",
            note=None,
            digest=action_digest("work_order", PAYLOAD),
        )
    assert stale.value.code == "stale_approval"


def test_a_failed_tasks_pending_action_is_superseded_and_never_approved_or_delivered(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    write(scripts, [*WAITING_ROUND[:3], {"tool_calls": [report_call("c3", "failed")]}])
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "failed"
    (action,) = rt.actions.list(task_id=task_id, status=None)
    assert action.status == "superseded"
    assert rt.actions.list(status="pending_approval", task_id=task_id) == []
    with pytest.raises(ConflictError) as stale:
        rt.actions.decide(action.action_id, approve=True, by="x", note=None, digest=action.digest)
    assert stale.value.code == "stale_approval"
    with rt.db.transaction(readonly=True) as conn:
        assert outbox_views.list_rows(conn, task_id=task_id, kind="action") == []
        assert [e.type for e in event_store.events_after(conn, task_id, 0, 100)][-1] == "failed"


def test_an_action_whose_node_was_cancelled_cannot_be_approved_but_is_rejected_and_frees_the_task(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, dispatcher, scripts = env
    cancelled = node("repair", "cancelled") | {"action_id": "${c2.result.action_id}"}
    write(
        scripts,
        [
            *WAITING_ROUND[:3],
            {"tool_calls": [plan_call("c4", "r2", [node("check", "completed"), cancelled])]},
            WAITING_ROUND[3],
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"  # on the action
    (action,) = rt.actions.list(task_id=task_id)
    with pytest.raises(ConflictError) as stale:
        rt.actions.decide(action.action_id, approve=True, by="x", note=None, digest=action.digest)
    assert stale.value.code == "stale_approval"
    rejected = rt.actions.decide(action.action_id, approve=False, by="x", note="node cancelled")
    assert rejected.status == "rejected"
    assert rt.tasks.get(task_id).status == "queued"
    assert dispatcher.sent[-1] == (task_id, 2)


def test_a_different_payload_supersedes_the_pending_proposal_of_its_node(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    other = {
        "id": "c4",
        "name": "propose_action",
        "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "south"}},
    }
    turns = [*WAITING_ROUND[:3], {"tool_calls": [other]}, WAITING_ROUND[3]]
    write(scripts, turns)
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    first, second = sorted(
        rt.actions.list(task_id=task_id, status=None), key=lambda a: a.created_at
    )
    assert (first.status, second.status) == ("superseded", "pending_approval")
    with pytest.raises(ConflictError) as stale:
        rt.actions.decide(first.action_id, approve=True, by="x", note=None, digest=first.digest)
    assert stale.value.code == "stale_approval"


def test_approval_over_http_names_the_digest(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    rt, _, scripts = env
    task_id, action_id = waiting_task(rt, scripts)
    app = create_app(load_settings(database_url=store_url))
    app.state.actions = None
    with TestClient(app) as client:
        from orchestrator.services.actions import ActionService

        app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
        shown = client.get(f"/api/v1/actions/{action_id}")
        assert shown.status_code == 200
        digest = shown.json()["digest"]
        assert shown.json()["plan_revision"] == 1
        no_digest = client.post(f"/api/v1/actions/{action_id}/approve", json={"by": "ana"})
        assert (no_digest.status_code, no_digest.json()["error"]["code"]) == (
            422,
            "digest_required",
        )
        wrong = client.post(
            f"/api/v1/actions/{action_id}/approve", json={"by": "ana", "digest": "a" * 64}
        )
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "stale_approval")
        ok = client.post(
            f"/api/v1/actions/{action_id}/approve",
            json={"by": "ana", "digest": digest, "note": "go"},
        )
        assert ok.status_code == 200
        assert (ok.json()["status"], ok.json()["decided_by"]) == ("approved", "ana")
        assert client.get(f"/api/v1/tasks/{task_id}").json()["status"] == "queued"
        missing = client.get("/api/v1/actions/nope")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_an_approval_short_of_its_digest_and_its_by_names_both_at_once(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    """Under the shared token `{}` used to be refused for `by`, and for the digest only on the
    next call: one refusal names every missing field, and the action stays pending."""
    rt, _, scripts = env
    _, action_id = waiting_task(rt, scripts)
    app = create_app(load_settings(database_url=store_url, api_token="shared-token"))
    with TestClient(app, headers={"Authorization": "Bearer shared-token"}) as client:
        from orchestrator.services.actions import ActionService

        app.state.actions = ActionService(rt.db, rt.plans, RecordingDispatcher())
        empty = client.post(f"/api/v1/actions/{action_id}/approve", json={})
        assert empty.status_code == 422
        error = empty.json()["error"]
        assert error["code"] == "digest_required"
        assert [d["field"] for d in error["details"]] == ["digest", "by"]
        assert "`digest` and `by` are required" in error["message"]
        # One field short: that field alone, with the code it always had.
        by_only = client.post(f"/api/v1/actions/{action_id}/approve", json={"by": "ana"})
        assert [d["field"] for d in by_only.json()["error"]["details"]] == ["digest"]
        digest = client.get(f"/api/v1/actions/{action_id}").json()["digest"]
        no_by = client.post(f"/api/v1/actions/{action_id}/approve", json={"digest": digest})
        assert (no_by.status_code, no_by.json()["error"]["details"][0]["field"]) == (422, "by")
        assert client.get(f"/api/v1/actions/{action_id}").json()["status"] == "pending_approval"
