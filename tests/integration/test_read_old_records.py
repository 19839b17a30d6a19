"""Read routes over records an older version (or a hand edit) stored in another shape: plan
nodes and edges, an action's payload, transcript bodies. Each route answers 200 with what it
can read and the odd part as its JSON text (as the explain view does), and the CLI prints the
same, never a 500 or a traceback. New writes are validated as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select, update

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.errors import ValidationFailed
from orchestrator.runtime import Runtime
from orchestrator.services.task_stream import TaskStreamService
from orchestrator.store.tables import (
    actions,
    plan_revisions,
    reports,
    task_events,
    transcript_entries,
)
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for, simple_task
from tests.integration.receipt_rows import chat_session
from tests.sse_support import parse


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


GOOD = {
    "id": "a",
    "title": "Step a",
    "actor": "agent",
    "description": "",
    "evidence": "read it",
    "status": "completed",
    "reason": None,
}
NO_ACTOR = {"id": "b", "title": "Step b", "status": "completed", "evidence": "x"}  # before actors
ODD_STATUS = {**GOOD, "id": "c", "status": "blocked"}  # a status no longer known
WRONG_TYPE = {**GOOD, "id": "d", "title": ["a", "list"]}
NODES = [GOOD, NO_ACTOR, ODD_STATUS, WRONG_TYPE, 7, "a line of text"]
SENT_NODES = [GOOD, _text(NO_ACTOR), _text(ODD_STATUS), _text(WRONG_TYPE), "7", "a line of text"]
GOOD_EDGE = {"from": "a", "to": "b", "label": None}
EDGES = [GOOD_EDGE, {"from": "a", "to": "c"}, ["a", "d"]]  # no label (older); a pair
SENT_EDGES = [GOOD_EDGE, _text({"from": "a", "to": "c"}), _text(["a", "d"])]

LIST_PAYLOAD = ["close", "valve 7"]
TEXT_PAYLOAD = "close valve 7"


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


@pytest.fixture
def client(rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(rt.settings, db=rt.db), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def cli(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The CLI reads the same store."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    return monkeypatch


@pytest.fixture
def old_task(rt: Runtime, scripts: Path) -> dict[str, Any]:
    """A completed task, then records of older shapes written straight into the store: a plan
    revision, two pending actions, transcript entries."""
    task_id = simple_task(rt, scripts)
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    now = utcnow()
    with rt.db.transaction() as conn:
        revision = conn.execute(
            select(func.max(plan_revisions.c.revision)).where(
                plan_revisions.c.session_id == session_id
            )
        ).scalar_one()
        conn.execute(
            insert(plan_revisions).values(
                session_id=session_id,
                revision=revision + 1,
                request_id="old",
                schema_version="execution-plan@1",
                title="an older plan",
                reason="",
                nodes=NODES,
                edges=EDGES,
                content_digest="0" * 64,
                task_id=task_id,
                generation=1,
                updated_at=now,
            )
        )
        for action_id, payload in (("act-list", LIST_PAYLOAD), ("act-text", TEXT_PAYLOAD)):
            conn.execute(
                insert(actions).values(
                    action_id=action_id,
                    task_id=task_id,
                    generation=1,
                    session_id=session_id,
                    node_id="a",
                    kind="work_order",
                    payload=payload,
                    status="pending_approval",
                    created_at=now,
                    plan_revision=revision + 1,
                    digest="0" * 64,
                )
            )
        seq = conn.execute(
            select(func.max(transcript_entries.c.seq)).where(
                transcript_entries.c.session_id == session_id
            )
        ).scalar_one()
        for offset, (kind, body) in enumerate(ENTRIES, start=1):
            conn.execute(
                insert(transcript_entries).values(
                    session_id=session_id,
                    seq=seq + offset,
                    task_id=task_id,
                    generation=1,
                    turn=90 + offset,
                    kind=kind,
                    call_id="x9" if kind == "tool_result" else None,
                    body=body,
                    created_at=now,
                )
            )
    return {"task_id": task_id, "session_id": session_id, "revision": revision + 1}


ENTRIES: list[tuple[str, Any]] = [
    ("model_turn", ["an", "older", "body"]),  # not an object
    ("tool_result", "done"),  # a string
    ("model_turn", {"tool_calls": [{"name": "call_api"}, "x9", {"id": "x9", "name": 3}]}),
    ("tool_result", {}),  # lacks every key
    ("summary", {"summary": ["not", "text"]}),
]


# ---- plans -----------------------------------------------------------------------------


def _assert_degraded(plan: dict[str, Any]) -> None:
    assert plan["title"] == "an older plan"
    assert plan["nodes"] == SENT_NODES
    assert plan["edges"] == SENT_EDGES
    counts = plan["status_counts"]
    # a, b and d: the known status of a node of an older shape still counts; c's does not.
    assert counts["completed"] == 3
    assert sum(counts.values()) == 3


def test_the_plan_routes_show_an_older_plan_degraded(
    old_task: dict[str, Any], client: TestClient
) -> None:
    session, task_id = old_task["session_id"], old_task["task_id"]
    one = client.get(f"/api/v1/sessions/{session}/execution-plans/{old_task['revision']}")
    assert one.status_code == 200, one.text
    _assert_degraded(one.json())
    history = client.get(f"/api/v1/sessions/{session}/execution-plans")
    assert history.status_code == 200, history.text
    _assert_degraded(history.json()["latest"])
    assert history.json()["revisions"][-1]["status_counts"]["completed"] == 3
    of_task = client.get(f"/api/v1/tasks/{task_id}/plan")
    assert of_task.status_code == 200, of_task.text
    _assert_degraded(of_task.json()["plan"])
    explain = client.get(f"/api/v1/tasks/{task_id}")
    assert explain.status_code == 200, explain.text
    _assert_degraded(explain.json()["plan"])
    # The two streams send the plan as the routes do (a finished session: the snapshot only).
    with client.stream("GET", f"/api/v1/agent/chat/session/{session}/stream") as response:
        assert response.status_code == 200
        [state] = parse(response.read().decode())
    _assert_degraded(state["data"]["execution_plans"][0])
    assert state["data"]["execution_plans"][0] == one.json()
    with client.stream("GET", f"/api/v1/tasks/{task_id}/stream") as response:
        assert response.status_code == 200
        [state] = parse(response.read().decode())
    assert state["data"]["plan"] == one.json()


def test_plans_show_prints_an_older_plan_readably(
    old_task: dict[str, Any],
    cli: pytest.MonkeyPatch,
    client: TestClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = old_task["session_id"]
    assert main(["plans", "show", session]) == 0
    shown = capsys.readouterr().out
    assert "[completed] a: Step a (agent)" in shown
    assert f"  {_text(NO_ACTOR)}" in shown  # listed as written, under the readable tree
    assert "  7" in shown
    assert f"  {_text(['a', 'd'])}" in shown
    assert main(["plans", "show", session, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == client.get(f"/api/v1/sessions/{session}/execution-plans").json()["latest"]


# ---- actions ---------------------------------------------------------------------------


def test_the_action_routes_show_a_payload_of_another_shape_as_text(
    old_task: dict[str, Any], client: TestClient
) -> None:
    listed = client.get("/api/v1/actions", params={"task_id": old_task["task_id"]})
    assert listed.status_code == 200, listed.text
    payloads = {a["action_id"]: a["payload"] for a in listed.json()["items"]}
    assert payloads == {"act-list": _text(LIST_PAYLOAD), "act-text": TEXT_PAYLOAD}
    one = client.get("/api/v1/actions/act-list")
    assert one.status_code == 200, one.text
    assert one.json()["payload"] == _text(LIST_PAYLOAD)
    explain = client.get(f"/api/v1/tasks/{old_task['task_id']}")
    assert explain.status_code == 200, explain.text
    pending = {a["action_id"]: a["payload"] for a in explain.json()["pending_actions"]}
    assert pending == payloads


def test_actions_list_and_show_print_a_payload_of_another_shape(
    old_task: dict[str, Any],
    cli: pytest.MonkeyPatch,
    client: TestClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["actions", "show", "act-list"]) == 0
    shown = capsys.readouterr().out
    assert f"  payload (not an object):\n    {_text(LIST_PAYLOAD)}\n" in shown
    assert main(["actions", "show", "act-list", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["payload"] == client.get("/api/v1/actions/act-list").json()["payload"]
    assert main(["actions", "list", "--task", old_task["task_id"], "--json"]) == 0
    printed = {a["action_id"]: a["payload"] for a in json.loads(capsys.readouterr().out)}
    sent = client.get("/api/v1/actions", params={"task_id": old_task["task_id"]}).json()
    assert printed == {a["action_id"]: a["payload"] for a in sent["items"]}
    assert main(["tasks", "show", old_task["task_id"], "--json"]) == 0
    shown_task = json.loads(capsys.readouterr().out)
    sent_task = client.get(f"/api/v1/tasks/{old_task['task_id']}").json()
    for part in ("plan", "pending_actions"):
        assert shown_task[part] == sent_task[part], part


# ---- transcript ------------------------------------------------------------------------


def test_the_transcript_route_shows_odd_entries_as_text(
    old_task: dict[str, Any], client: TestClient
) -> None:
    response = client.get(f"/api/v1/tasks/{old_task['task_id']}/transcript")
    assert response.status_code == 200, response.text
    odd = [e for e in response.json()["items"] if e["turn"] > 90]
    assert [e["body"] for e in odd] == [
        _text(["an", "older", "body"]),
        "done",
        ENTRIES[2][1],
        {},
        {"summary": ["not", "text"]},
    ]


def test_tasks_transcript_prints_odd_entries_readably(
    old_task: dict[str, Any],
    cli: pytest.MonkeyPatch,
    client: TestClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task_id = old_task["task_id"]
    assert main(["tasks", "transcript", task_id]) == 0
    shown = capsys.readouterr().out
    assert f"[91] model: (unreadable) {_text(['an', 'older', 'body'])}" in shown
    assert "[92]   <- x9 None: None (unreadable) done" in shown
    assert f"[93]   -> (unreadable) {_text({'name': 'call_api'})}" in shown
    assert "[93]   -> (unreadable) x9" in shown
    assert '[93]   -> (unreadable) {"id": "x9", "name": 3}' in shown
    assert "[94]   <- x9 None: None" in shown
    assert '[95] summary: ["not", "text"]' in shown
    assert main(["tasks", "transcript", task_id, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    sent = client.get(f"/api/v1/tasks/{task_id}/transcript", params={"limit": 1000}).json()
    assert [e["body"] for e in printed["items"]] == [e["body"] for e in sent["items"]]


# ---- the report in the explain view ----------------------------------------------------


def test_a_report_of_another_shape_is_shown_degraded(
    old_task: dict[str, Any],
    rt: Runtime,
    client: TestClient,
    cli: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Findings stored as one value instead of a list, evidence references that are not text."""
    with rt.db.transaction() as conn:
        conn.execute(
            update(reports)
            .where(reports.c.task_id == old_task["task_id"])
            .values(findings={"text": "one finding"}, evidence_refs=["ev-1", 7, {"id": "e"}])
        )
    response = client.get(f"/api/v1/tasks/{old_task['task_id']}")
    assert response.status_code == 200, response.text
    report = response.json()["report"]
    assert report["findings"] == [{"text": "one finding"}]
    assert report["evidence_refs"] == ["ev-1", "7", _text({"id": "e"})]
    assert main(["tasks", "show", old_task["task_id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == report


def _plan(request_id: str, *nodes: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": request_id, "title": "t", "reason": "r", "nodes": list(nodes)}


def test_a_plan_published_over_a_revision_of_an_older_shape_is_checked_not_crashed(
    rt: Runtime,
) -> None:
    # The keep-every-node rule reads the previous revision's nodes: one that is not an object,
    # or has no id, cannot be matched and is not asked for (it stays in its own revision); the
    # rest of the rule holds as before. Before, the publish raised TypeError or KeyError: a 500
    # on the internal publish route, an exception in the agent's tool.
    session_id = chat_session(rt.db)
    first = {**GOOD, "status": "running"}
    rt.plans.publish_execution_plan(session_id, _plan("r1", first))
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=[first, 7, "a line", {"title": "no id"}, {**GOOD, "id": "k"}])
        )
    with pytest.raises(ValidationFailed) as refused:  # "k" is still a node that must be kept
        rt.plans.publish_execution_plan(session_id, _plan("r2", first))
    assert [d["code"] for d in refused.value.details] == ["node_removed"]
    result = rt.plans.publish_execution_plan(
        session_id, _plan("r3", {**GOOD, "status": "completed"}, {**GOOD, "id": "k"})
    )
    assert (result.created, result.plan.revision) == (True, 2)
    assert [node["id"] for node in result.plan.nodes] == ["a", "k"]


def test_the_task_stream_sends_events_of_another_shape_instead_of_ending(
    old_task: dict[str, Any], rt: Runtime
) -> None:
    # A task event whose data is not an object, and a plan_revision event that names no
    # revision readably: each raised inside the stream's read (TypeError, KeyError), which cut
    # a running stream off. They are sent: the data as its JSON text, the plan as null.
    task_id = old_task["task_id"]
    with rt.db.transaction() as conn:
        last = conn.execute(
            select(func.max(task_events.c.seq)).where(task_events.c.task_id == task_id)
        ).scalar_one()
        for offset, (kind, data) in enumerate(
            [
                ("action_proposed", ["act-1", "valve 7"]),
                ("plan_revision", {"session": "x"}),
                ("plan_revision", {"session_id": old_task["session_id"], "revision": "1"}),
                ("note", 7),
            ],
            start=1,
        ):
            conn.execute(
                insert(task_events).values(
                    task_id=task_id,
                    seq=last + offset,
                    type=kind,
                    generation=1,
                    status="completed",
                    reason=None,
                    data=data,
                    created_at=utcnow(),
                )
            )
    events = TaskStreamService(rt.db).events_after(task_id, last)
    assert [(e.seq, e.name) for e in events] == [
        (last + 1, "action_proposed"),
        (last + 2, "execution_plan"),
        (last + 3, "execution_plan"),
        (last + 4, "note"),
    ]
    assert events[0].data["data"] == '["act-1", "valve 7"]'
    assert events[1].data["plan"] is None
    assert events[2].data["plan"]["revision"] == 1  # a revision stored as text still reads
    assert events[3].data["data"] == "7"


def test_a_stored_node_with_an_id_and_an_unreadable_status_must_still_be_kept(
    rt: Runtime,
) -> None:
    # Seed 004 (更新必须保留原节点): a node with an id is kept whatever its stored status (null,
    # absent, a list); before, it was left out of the rule and a publish could drop it.
    session_id = chat_session(rt.db)
    first = {**GOOD, "status": "running"}
    rt.plans.publish_execution_plan(session_id, _plan("r1", first))
    lost = {"id": "k", "title": "sample", "actor": "human"}
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=[first, {**lost, "status": None}, {**GOOD, "id": "m", "status": [1]}])
        )
    with pytest.raises(ValidationFailed) as refused:
        rt.plans.publish_execution_plan(session_id, _plan("r2", first))
    assert [(d["code"], d["node_id"]) for d in refused.value.details] == [
        ("node_removed", "k"),
        ("node_removed", "m"),
    ]
    kept = rt.plans.publish_execution_plan(
        session_id,
        _plan("r3", first, {**lost, "status": "pending"}, {**GOOD, "id": "m", "status": "skipped"}),
    )
    assert [node["id"] for node in kept.plan.nodes] == ["a", "k", "m"]


def _running_generation(rt: Runtime, scripts: Path) -> tuple[Any, str]:
    """Generation 1 of a new task, claimed as a worker would: its fence and session."""
    from orchestrator.domain.fences import Fence
    from orchestrator.store import executions as execution_store
    from tests.executions_support import claim_as_worker

    task_id = simple_task(rt, scripts)
    fence = Fence(task_id, 1, claim_as_worker(rt, task_id, 1, "w", 30))
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    return fence, execution.session_id


def test_the_end_of_a_round_does_not_complete_over_a_node_it_cannot_read(
    rt: Runtime, scripts: Path
) -> None:
    # A node of the current plan that is not an object, or has no id, cannot be shown done:
    # the decision counts it as open (the agent's next revision may leave it out). Before, the
    # rules did not see it, and a plan whose other nodes were done completed the task.
    from dataclasses import replace

    from orchestrator.services.round_end import decide_round, finish_generation, fixed

    fence, session_id = _running_generation(rt, scripts)
    running = {**GOOD, "status": "running"}  # completed in the store below (no citation here)
    rt.plans.publish_execution_plan(session_id, _plan("r1", running), fence=fence)
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=[GOOD, "sample the tap", {"title": "no id", "status": "pending"}])
        )
    seen: list[Any] = []

    def rule(facts: Any) -> Any:
        seen.append(facts)
        return fixed(decide_round(facts, max_rounds=5, turn_budget_spent=False))(facts)

    finish_generation(rt.db, fence, rule)
    (facts,) = seen
    decision = decide_round(
        replace(facts, report_outcome="completed"), max_rounds=5, turn_budget_spent=False
    )
    assert decision.task_status != "completed", decision


def test_an_action_proposed_over_a_plan_with_a_node_of_an_older_shape_is_refused_clearly(
    rt: Runtime, scripts: Path
) -> None:
    # The proposal looks its node up in the saved plan: a node that is not an object raised
    # TypeError (an exception in the agent's tool); the republish now refuses the plan with
    # what is wrong, and nothing is written.
    fence, session_id = _running_generation(rt, scripts)
    pending = {**GOOD, "id": "k", "status": "pending", "evidence": ""}
    rt.plans.publish_execution_plan(session_id, _plan("r1", pending), fence=fence)
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=[7, pending])
        )
    with pytest.raises(ValidationFailed) as refused:
        rt.actions.propose(fence, session_id, "k", "work_order", {"crew": "flush"})
    assert refused.value.code == "invalid_type"
    with rt.db.transaction(readonly=True) as conn:
        assert conn.execute(select(func.count()).select_from(actions)).scalar_one() == 0


def test_an_edge_whose_ends_are_not_text_is_refused_or_left_out_not_crashed(
    rt: Runtime, scripts: Path
) -> None:
    # An edge stored with a list as its `from` made the republish of an action proposal raise
    # TypeError (unhashable, in distinct_edges): now the plan is refused with what is wrong and
    # nothing is written. The rules that read the previous plan leave such an edge out.
    from orchestrator.domain.plans import readable_edges

    fence, session_id = _running_generation(rt, scripts)
    pending = {**GOOD, "id": "k", "status": "pending", "evidence": ""}
    first = {**GOOD, "status": "pending", "evidence": ""}
    rt.plans.publish_execution_plan(session_id, _plan("r1", first, pending), fence=fence)
    odd = [{"from": ["a"], "to": "k"}, {"from": "a", "to": {"k": 1}}]
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(edges=[*odd, GOOD_EDGE])
        )
    with pytest.raises(ValidationFailed) as refused:
        rt.actions.propose(fence, session_id, "k", "work_order", {"crew": "flush"})
    assert refused.value.code == "invalid_type"
    with rt.db.transaction(readonly=True) as conn:
        assert conn.execute(select(func.count()).select_from(actions)).scalar_one() == 0
    assert readable_edges([*odd, GOOD_EDGE]) == [GOOD_EDGE]


def test_the_task_stream_sends_a_plan_event_whose_revision_no_store_can_hold(
    old_task: dict[str, Any], rt: Runtime
) -> None:
    # A revision of digits int() cannot read ("²" is a digit to str.isdigit), or past what the
    # column holds (SQLite's 64 bits, Postgres's 32): the read raised ValueError, OverflowError
    # or DataError inside the stream and cut it off. Sent with the plan as null.
    task_id = old_task["task_id"]
    session_id = old_task["session_id"]
    with rt.db.transaction() as conn:
        last = conn.execute(
            select(func.max(task_events.c.seq)).where(task_events.c.task_id == task_id)
        ).scalar_one()
        for offset, revision in enumerate(["²", 2**70, str(2**70), 2**40, -1], start=1):
            conn.execute(
                insert(task_events).values(
                    task_id=task_id,
                    seq=last + offset,
                    type="plan_revision",
                    generation=1,
                    status="completed",
                    reason=None,
                    data={"session_id": session_id, "revision": revision},
                    created_at=utcnow(),
                )
            )
    events = TaskStreamService(rt.db).events_after(task_id, last)
    assert [e.name for e in events] == ["execution_plan"] * 5
    assert [e.data["plan"] for e in events] == [None] * 5
