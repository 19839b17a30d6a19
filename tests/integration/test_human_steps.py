"""A person closes a human node: a server-side revision that moves the task, never lost to or
losing the agent's concurrent writes."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.domain.fences import Fence
from orchestrator.errors import OrchestratorError
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.task_stream import TaskStreamService
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store.task_events import events_after
from orchestrator.store.task_plans import task_latest_plan
from orchestrator.tools.tasks import ReadTaskContext
from tests.executions_support import (
    READ_AND_QUERY,
    claim_as_worker,
    fenced_ctx,
    kept_node,
    node,
    plan_call,
    report_call,
    runtime_for,
    write_script,
)


def write(scripts: Path, turns: list[dict[str, Any]]) -> None:
    write_script(scripts, "hs", turns, record_requests=True)


CHECK_TO_SAMPLE = {"from": "check", "to": "sample"}


def sample(status: str) -> dict[str, Any]:
    return node("sample", status, actor="human", evidence="chlorine 0.4 mg/L")


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, RecordingDispatcher, Path]]:
    runtime, dispatcher = runtime_for(store_url, tmp_path / "scripts")
    yield runtime, dispatcher, tmp_path / "scripts"
    runtime.close()


def waiting_on_a_sample(rt: Runtime, scripts: Path, *, callback: bool = False) -> str:
    nodes = [node("check", "completed"), sample("waiting")]
    if callback:
        nodes.append(node("callback", "pending", actor="human"))
    write(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", nodes)]},
            {"tool_calls": [report_call("c2", "waiting")]},
        ],
    )
    task_id = rt.tasks.trigger(Trigger(task_type="hs", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    return task_id


def at_once(first: Callable[[], None], second: Callable[[], None], *, in_order: bool) -> None:
    """Run both on threads released by one barrier, started in this order or the other; neither
    may raise."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(call: Callable[[], None]) -> None:
        try:
            barrier.wait(timeout=10)
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in (first, second)]
    for thread in threads if in_order else reversed(threads):
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []


def client_for(rt: Runtime, store_url: str, dispatcher: RecordingDispatcher) -> TestClient:
    app = create_app(load_settings(database_url=store_url))
    app.state.human_steps = HumanStepService(rt.db, app.state.plans, dispatcher)
    return TestClient(app)


def test_a_human_node_completed_through_the_api_resumes_the_task(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    rt, dispatcher, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)
    with client_for(rt, store_url, dispatcher) as client:
        done = client.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"by": "lab tech", "evidence": "chlorine 0.4 mg/L at tap 3"},
        )
        assert done.status_code == 200, done.text
        body = done.json()
        assert (body["status"], body["by"], body["plan_revision"]) == ("completed", "lab tech", 2)
        assert (body["task_status"], body["generation"]) == ("queued", 2)
    assert dispatcher.sent[-1] == (task_id, 2)
    task = rt.tasks.get(task_id)
    assert (task.status, task.intent_round) == ("queued", 1)
    # The task stream's log has the person's revision, then the move to generation 2.
    with rt.db.transaction(readonly=True) as conn:
        logged = [
            (e.type, e.data.get("revision"), e.generation)
            for e in events_after(conn, task_id, 0, 50)
        ]
    assert logged[-2:] == [("plan_revision", 2, 1), ("queued", None, 2)]

    # Generation 2 keeps both nodes as they are: the check it completed, the sample a person closed.
    completing = [kept_node(0), kept_node(1)]
    write(
        scripts,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", completing, edges=[CHECK_TO_SAMPLE])]},
            {"tool_calls": [report_call("c2", "completed")]},
        ],
    )
    assert rt.executions.run(task_id, 2, worker="w").outcome == "completed"
    lines = (scripts / "hs.json.requests.jsonl").read_text(encoding="utf-8").splitlines()
    seen = next(
        json.loads(m["content"])["result"]
        for m in json.loads(lines[-1])["messages"]
        if m["role"] == "tool" and m["tool_call_id"] == "c0"
    )
    (node_seen,) = [n for n in seen["previous_generation"]["plan"]["nodes"] if n["id"] == "sample"]
    assert node_seen["status"] == "completed"
    assert node_seen["evidence"] == "chlorine 0.4 mg/L at tap 3"
    assert "completed by lab tech at" in node_seen["reason"]


def test_refusals_write_nothing(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    rt, dispatcher, scripts = env
    task_id = waiting_on_a_sample(rt, scripts, callback=True)
    base = f"/api/v1/tasks/{task_id}/nodes"
    with client_for(rt, store_url, dispatcher) as client:
        cases = [
            (f"{base}/check/complete", {"by": "a", "evidence": "x"}, 409, "agent_node"),
            (f"{base}/nope/skip", {"by": "a", "reason": "x"}, 404, "unknown_node"),
            ("/api/v1/tasks/nope/nodes/sample/fail", {"by": "a", "reason": "x"}, 404, "not_found"),
            (f"{base}/sample/fail", {"by": "a"}, 422, "invalid_request"),
            (f"{base}/sample/complete", {"evidence": "x"}, 422, "invalid_request"),
            (f"{base}/sample/complete", {"by": "a", "evidence": "  "}, 422, "invalid_request"),
            (f"{base}/sample/fail", {"by": " ", "reason": "x"}, 422, "invalid_request"),
        ]
        for path, body, status, code in cases:
            answer = client.post(path, json=body)
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), path
        assert rt.plans.latest(rt.tasks.get(task_id).session_id or "") is not None
        skipped = client.post(f"{base}/sample/skip", json={"by": "a", "reason": "no access"})
        assert skipped.status_code == 200
        # The call-back is still open: the task keeps waiting.
        assert (skipped.json()["task_status"], skipped.json()["generation"]) == ("waiting", 1)
        again = client.post(f"{base}/sample/complete", json={"by": "a", "evidence": "x"})
        assert (again.status_code, again.json()["error"]["code"]) == (409, "node_closed")
        last = client.post(f"{base}/callback/fail", json={"by": "a", "reason": "no answer"})
        assert (last.json()["task_status"], last.json()["generation"]) == ("queued", 2)
        # The next generation has no plan yet: the step applies to the task's latest plan,
        # where the sample is already skipped.
        early = client.post(f"{base}/sample/complete", json={"by": "a", "evidence": "x"})
        assert (early.status_code, early.json()["error"]["code"]) == (409, "node_closed")
    plan = rt.plans.latest(skipped.json()["session_id"])
    assert plan is not None
    assert plan.revision == 3


def fail_the_sample(rt: Runtime, scripts: Path) -> tuple[str, str]:
    """A task waiting on a sample and a call-back whose sample a person failed: generation 2
    is queued, with no plan of its own yet. The task, and generation 1's session."""
    task_id = waiting_on_a_sample(rt, scripts, callback=True)
    first_session = rt.tasks.get(task_id).session_id
    assert first_session is not None
    failed = rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="tap dry")
    assert (failed.task_status, failed.generation, failed.plan.revision) == ("queued", 2, 2)
    return task_id, first_session


def test_a_step_is_closed_in_the_latest_plan_while_the_next_generation_has_none(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    """It answered 409 `no_plan` until generation 2's agent published: an operator with a
    call-back to record waited minutes, or for ever if that generation never published."""
    rt, dispatcher, scripts = env
    task_id, first_session = fail_the_sample(rt, scripts)
    with client_for(rt, store_url, dispatcher) as client:
        done = client.post(
            f"/api/v1/tasks/{task_id}/nodes/callback/complete",
            json={"by": "desk", "evidence": "resident says the water is clear"},
        )
        assert done.status_code == 200, done.text
        body = done.json()
        # Written into generation 1's plan; the task stays where it is, in generation 2.
        assert (body["session_id"], body["plan_revision"]) == (first_session, 3)
        # The answer says whose plan that is: the session id alone did not.
        assert (body["plan_generation"], body["task_status"], body["generation"]) == (
            1,
            "queued",
            2,
        )
        shown = client.get(f"/api/v1/tasks/{task_id}/plan").json()["plan"]
    assert (shown["session_id"], shown["revision"]) == (first_session, 3)
    callback = next(n for n in shown["nodes"] if n["id"] == "callback")
    assert callback["status"] == "completed"
    assert "completed by desk at" in callback["reason"]
    # The task stream logs the revision under the plan's generation and shows it.
    stream = TaskStreamService(rt.db)
    (last,) = stream.events_after(task_id, stream.snapshot(task_id).last_seq - 1)
    assert (last.name, last.data["generation"], last.data["status"]) == (
        "execution_plan",
        1,
        "queued",
    )
    assert (last.data["plan"]["session_id"], last.data["plan"]["revision"]) == (first_session, 3)
    assert stream.snapshot(task_id).data["plan"]["revision"] == 3
    assert dispatcher.sent.count((task_id, 2)) == 1


def test_a_second_failed_step_queues_no_second_generation(
    env: tuple[Runtime, RecordingDispatcher, Path],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    rt, dispatcher, scripts = env
    task_id, _ = fail_the_sample(rt, scripts)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    fail = ["tasks", "node", task_id, "callback", "--fail", "--reason", "no answer", "--by", "desk"]
    assert main(fail) == 0
    assert capsys.readouterr().out == (
        f"node callback failed by desk (plan revision 3 of generation 1); task {task_id} is "
        "queued, generation 2\n"
    )
    # `tasks show` says where that is, not only that generation 2 has no plan.
    assert main(["tasks", "show", task_id]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "plan" in x and "revision" in x]
    assert line == (
        "  plan: none yet for this generation; the task's plan is revision 3 of generation 1: "
        "Investigation (completed 1, failed 2), where a person's step goes"
    )
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("queued", 2)
    assert [g for t, g in dispatcher.sent if t == task_id and g > 1] == [2]
    with rt.db.transaction(readonly=True) as conn:
        queued = [e.generation for e in events_after(conn, task_id, 0, 50) if e.type == "queued"]
    assert queued == [2]  # generation 1 was triggered, not queued by a decision


def test_the_next_generation_s_first_plan_keeps_a_step_closed_while_it_ran(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Invariant 22: generation 2 runs (no plan yet), a person completes the call-back in
    generation 1's plan; the agent's first plan still shows it pending, as it read it. The
    running generation's fence holds, and its stored plan keeps the person's completion."""
    rt, dispatcher, scripts = env
    task_id, first_session = fail_the_sample(rt, scripts)
    read_by_agent = rt.plans.latest(first_session)  # what the agent read before the step
    assert read_by_agent is not None
    fence = Fence(task_id, 2, claim_as_worker(rt, task_id, 2, "w", ttl=60))
    step = rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert (step.task_status, step.generation, step.plan.generation) == ("running", 2, 1)
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("running", 2)
    session_id = task.session_id
    assert session_id is not None
    assert session_id != first_session
    assert rt.plans.latest(session_id) is None
    still_open = {"callback": "pending", "sample": "failed"}
    assert {n["id"]: n["status"] for n in read_by_agent.nodes if n["actor"] == "human"} == (
        still_open
    )
    first = {
        "request_id": "g2-r1",
        "title": "Investigation",
        "reason": "generation 2 takes over",
        "nodes": read_by_agent.nodes,
        "edges": read_by_agent.edges,
    }
    published = rt.plans.publish_execution_plan(session_id, first, fence=fence).plan
    assert (published.session_id, published.revision, published.generation) == (session_id, 1, 2)
    callback = next(n for n in published.nodes if n["id"] == "callback")
    assert callback["status"] == "completed"
    assert "completed by desk at" in callback["reason"]
    assert [g for t, g in dispatcher.sent if t == task_id and g > 1] == [2]


@pytest.mark.parametrize("round_number", range(2))
def test_a_step_and_the_next_generation_s_first_plan_at_once_are_both_kept(
    env: tuple[Runtime, RecordingDispatcher, Path], round_number: int
) -> None:
    """Whichever commits first (the step into generation 1's plan, or generation 2's first
    plan, which the step then goes into), the task's plan ends with both."""
    rt, _, scripts = env
    task_id, first_session = fail_the_sample(rt, scripts)
    read_by_agent = rt.plans.latest(first_session)
    assert read_by_agent is not None
    fence = Fence(task_id, 2, claim_as_worker(rt, task_id, 2, "w", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None

    def person() -> None:
        rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")

    def agent() -> None:
        body = {"request_id": "g2-r1", "title": "T", "reason": "generation 2",
                "nodes": read_by_agent.nodes, "edges": read_by_agent.edges}  # fmt: skip
        rt.plans.publish_execution_plan(session_id, body, fence=fence)

    at_once(person, agent, in_order=bool(round_number % 2))
    with rt.db.transaction(readonly=True) as conn:
        latest = task_latest_plan(conn, task_id)
    assert latest is not None
    assert (latest.session_id, latest.generation) == (session_id, 2)
    statuses = {n["id"]: n["status"] for n in latest.nodes}
    assert statuses == {"check": "completed", "sample": "failed", "callback": "completed"}
    assert (rt.tasks.get(task_id).status, rt.tasks.get(task_id).generation) == ("running", 2)


def test_after_a_generation_with_no_plan_the_next_reads_the_step_it_must_keep(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Generation 2 ran and published nothing (an operator requeued it: a lost lease does the
    same); a person completed the call-back in generation 1's plan. Generation 3's agent read
    generation 2's plan (none) as the one to continue, never saw the plan its first publish
    must keep (generation 1's, with the person's step), and so could not publish it."""
    rt, _, scripts = env
    task_id, first_session = fail_the_sample(rt, scripts)
    stuck = claim_as_worker(rt, task_id, 2, "w", ttl=60)
    rt.tasks.requeue(task_id, "worker stuck")
    assert rt.leases.release(task_lease(task_id), stuck)  # its worker stopped
    step = rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert (step.plan.session_id, step.plan.generation, step.generation) == (first_session, 1, 3)
    fence = Fence(task_id, 3, claim_as_worker(rt, task_id, 3, "w", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    context = ReadTaskContext(rt.db).run(fenced_ctx(fence, session_id), None)
    assert context.status == "succeeded", context
    previous = context.payload["previous_generation"]
    assert previous["generation"] == 2  # the generation before, as it ended
    plan = previous["plan"]
    assert plan is not None
    assert (plan["session_id"], plan["revision"]) == (first_session, 3)
    statuses = {n["id"]: n["status"] for n in plan["nodes"]}
    assert statuses == {"check": "completed", "sample": "failed", "callback": "completed"}
    # What it read is what its first plan keeps: published as read, it is accepted.
    body = {"request_id": "g3-r1", "title": "T", "reason": "generation 3",
            "nodes": plan["nodes"], "edges": plan["edges"]}  # fmt: skip
    published = rt.plans.publish_execution_plan(session_id, body, fence=fence).plan
    assert (published.generation, published.revision) == (3, 1)


def test_the_session_a_step_can_still_go_into_is_not_finished_for_its_stream(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """Generation 1's session counted as finished once generation 2 was queued, so its plan
    stream ended and a reconnect that had seen revision 2 was told 204 (nothing more, ever);
    then a person's step wrote revision 3 there. It finishes once generation 2 publishes, or
    once no human node of its plan is open."""
    rt, _, scripts = env
    task_id, first_session = fail_the_sample(rt, scripts)
    read_by_agent = rt.plans.latest(first_session)
    assert read_by_agent is not None
    assert not rt.plans.state(first_session).finished
    assert rt.plans.takes_writes(first_session)
    fence = Fence(task_id, 2, claim_as_worker(rt, task_id, 2, "w", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None
    assert not rt.plans.state(first_session).finished  # running, and still no plan of its own
    body = {"request_id": "g2-r1", "title": "T", "reason": "generation 2",
            "nodes": read_by_agent.nodes, "edges": read_by_agent.edges}  # fmt: skip
    rt.plans.publish_execution_plan(session_id, body, fence=fence)
    state = rt.plans.state(first_session)
    assert (state.finished, state.newest) == (True, 2)
    step = rt.human_steps.close(task_id, "callback", "completed", by="desk", evidence="clear")
    assert step.plan.session_id == session_id  # the step went where the stream goes on


def test_a_session_with_no_human_node_open_finishes_when_the_next_generation_is_queued(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)  # the sample is its one human node
    first_session = rt.tasks.get(task_id).session_id
    assert first_session is not None
    rt.human_steps.close(task_id, "sample", "failed", by="lab", reason="tap dry")
    assert rt.tasks.get(task_id).status == "queued"
    assert rt.plans.state(first_session).finished  # no step can go into it any more


def test_a_task_with_no_plan_in_any_generation_still_refuses_a_step(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    rt, dispatcher, _ = env
    task_id = rt.tasks.trigger(Trigger(task_type="hs", title="Turbid water")).task.task_id
    claim_as_worker(rt, task_id, 1, "w", ttl=60)  # a session, and no plan in it
    with client_for(rt, store_url, dispatcher) as client:
        early = client.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete", json={"by": "a", "evidence": "x"}
        )
    assert (early.status_code, early.json()["error"]["code"]) == (409, "no_plan")
    assert "has no plan yet" in early.json()["error"]["message"]
    with rt.db.transaction(readonly=True) as conn:
        assert [e.type for e in events_after(conn, task_id, 0, 50)].count("plan_revision") == 0


def test_the_cli_completes_a_node(
    env: tuple[Runtime, RecordingDispatcher, Path],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    rt, _, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    with pytest.raises(OrchestratorError) as refused:
        rt.human_steps.close(task_id, "check", "completed", by="x", evidence="y")
    assert refused.value.code == "agent_node"
    assert main(["tasks", "node", task_id, "sample", "--fail"]) == 2  # --reason is required
    assert main(["tasks", "node", task_id, "sample", "--complete"]) == 2  # --evidence too
    assert main(["tasks", "node", task_id, "check", "--complete", "--evidence", "x"]) == 1
    assert rt.tasks.get(task_id).status == "waiting"
    capsys.readouterr()
    done = ["tasks", "node", task_id, "sample", "--complete", "--evidence", "0.4", "--by", "lab"]
    assert main(done) == 0
    assert "node sample completed by lab" in capsys.readouterr().out
    assert rt.tasks.get(task_id).status == "queued"


@pytest.mark.parametrize("round_number", range(3))
def test_concurrent_human_completion_and_agent_publish_are_both_kept(
    env: tuple[Runtime, RecordingDispatcher, Path], round_number: int
) -> None:
    rt, _, _ = env
    task_id = rt.tasks.trigger(Trigger(task_type="hs", title="Turbid water")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "w", ttl=60)
    fence = Fence(task_id, 1, token)
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None

    def plan(request_id: str, first: str) -> dict[str, Any]:
        nodes = [node("a", first), sample("waiting")]
        edges = [{"from": x["id"], "to": y["id"]} for x, y in itertools.pairwise(nodes)]
        return {
            "request_id": request_id,
            "title": "T",
            "reason": "r",
            "nodes": nodes,
            "edges": edges,
        }

    rt.plans.publish_execution_plan(session_id, plan("r1", "running"), fence=fence)

    def person() -> None:
        rt.human_steps.close(task_id, "sample", "completed", by="lab", evidence="ok")

    def agent() -> None:
        # The agent moves its own node on (completing it would need recorded evidence).
        rt.plans.publish_execution_plan(session_id, plan("r2", "waiting"), fence=fence)

    at_once(person, agent, in_order=bool(round_number % 2))
    latest = rt.plans.latest(session_id)
    assert latest is not None
    assert latest.revision == 3
    statuses = {n["id"]: n["status"] for n in latest.nodes}
    assert statuses == {"a": "waiting", "sample": "completed"}
    assert rt.tasks.get(task_id).status == "running"  # the running generation decides itself


def test_the_agent_cannot_rewrite_who_closed_a_human_node(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    rt, _, _ = env
    task_id = rt.tasks.trigger(Trigger(task_type="hs", title="Turbid water")).task.task_id
    fence = Fence(task_id, 1, claim_as_worker(rt, task_id, 1, "w", ttl=60))
    session_id = rt.tasks.get(task_id).session_id
    assert session_id is not None

    def publish(request_id: str, sampled: dict[str, Any]) -> Any:
        body = {"request_id": request_id, "title": "T", "reason": "r",
                "nodes": [node("a", "running"), sampled], "edges": []}  # fmt: skip
        return rt.plans.publish_execution_plan(session_id, body, fence=fence)

    publish("r1", sample("waiting"))
    rt.human_steps.close(task_id, "sample", "completed", by="lab", evidence="chlorine 0.4 mg/L")
    closed = next(n for n in rt.plans.latest(session_id).nodes if n["id"] == "sample")  # type: ignore[union-attr]
    assert "completed by lab at" in closed["reason"]
    for rewrite in ({"reason": "completed by the agent"}, {"evidence": "chlorine 0.1 mg/L"}):
        with pytest.raises(OrchestratorError) as caught:
            publish("r2", dict(closed, **rewrite))
        assert "human_node" in [p["code"] for p in caught.value.details]
    assert rt.plans.latest(session_id).revision == 2  # type: ignore[union-attr]
    assert publish("r3", closed).plan.revision == 3  # kept as the person left it


def test_a_plan_stored_with_a_repeated_edge_still_takes_a_persons_close(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    """A plan stored before `duplicate_edge` was refused: the person's revision goes out
    without the repeat instead of being refused for it."""
    from sqlalchemy import select, update

    from orchestrator.store.tables import plan_revisions

    rt, dispatcher, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)
    session_id = rt.tasks.get(task_id).session_id
    repeated = [CHECK_TO_SAMPLE, {**CHECK_TO_SAMPLE, "label": "again"}]
    with rt.db.transaction() as conn:
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(edges=repeated)
        )
    with client_for(rt, store_url, dispatcher) as client:
        done = client.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"by": "lab tech", "evidence": "chlorine 0.4 mg/L at tap 3"},
        )
    assert done.status_code == 200, done.text
    with rt.db.transaction(readonly=True) as conn:
        edges = conn.execute(
            select(plan_revisions.c.edges)
            .where(plan_revisions.c.session_id == session_id)
            .order_by(plan_revisions.c.revision.desc())
            .limit(1)
        ).scalar_one()
    assert [(e["from"], e["to"]) for e in edges] == [("check", "sample")]


def test_a_plan_stored_with_nodes_of_an_older_shape_still_takes_a_persons_close(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    """A node an older version or a hand edit stored in another shape (not an object, no id)
    and an edge that is not an object: the person's close answers 200 (it raised, a 500) and
    the person's revision carries the readable nodes; the odd ones stay in their revision."""
    from sqlalchemy import select, update

    from orchestrator.store.tables import plan_revisions

    rt, dispatcher, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)
    session_id = rt.tasks.get(task_id).session_id
    with rt.db.transaction() as conn:
        stored = conn.execute(
            select(plan_revisions.c.nodes).where(plan_revisions.c.session_id == session_id)
        ).scalar_one()
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=[*stored, 7, {"title": "no id"}], edges=[["check", "sample"]])
        )
    with client_for(rt, store_url, dispatcher) as client:
        done = client.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"by": "lab tech", "evidence": "chlorine 0.4 mg/L at tap 3"},
        )
    assert done.status_code == 200, done.text
    with rt.db.transaction(readonly=True) as conn:
        nodes = conn.execute(
            select(plan_revisions.c.nodes)
            .where(plan_revisions.c.session_id == session_id)
            .order_by(plan_revisions.c.revision.desc())
            .limit(1)
        ).scalar_one()
    assert [(n["id"], n["status"]) for n in nodes] == [
        ("check", "completed"),
        ("sample", "completed"),
    ]


def test_a_human_node_stored_without_a_readable_status_is_still_closed_by_its_person(
    env: tuple[Runtime, RecordingDispatcher, Path], store_url: str
) -> None:
    """A human node with an id and a status that is not text (null here, as an older version or
    a hand edit left it): the end of a round counts it as open, so the task waits for its
    person; the person's close must then be taken (it answered 409 `node_closed`, "already
    None": a task nobody could move), and the revision it writes keeps every node."""
    from sqlalchemy import select, update

    from orchestrator.store.tables import plan_revisions

    rt, dispatcher, scripts = env
    task_id = waiting_on_a_sample(rt, scripts)
    session_id = rt.tasks.get(task_id).session_id
    with rt.db.transaction() as conn:
        stored = conn.execute(
            select(plan_revisions.c.nodes).where(plan_revisions.c.session_id == session_id)
        ).scalar_one()
        odd = [{**n, "status": None} if n["id"] == "sample" else n for n in stored]
        conn.execute(
            update(plan_revisions)
            .where(plan_revisions.c.session_id == session_id)
            .values(nodes=odd)
        )
    with client_for(rt, store_url, dispatcher) as client:
        done = client.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"by": "lab tech", "evidence": "chlorine 0.4 mg/L at tap 3"},
        )
    assert done.status_code == 200, done.text
    with rt.db.transaction(readonly=True) as conn:
        nodes = conn.execute(
            select(plan_revisions.c.nodes)
            .where(plan_revisions.c.session_id == session_id)
            .order_by(plan_revisions.c.revision.desc())
            .limit(1)
        ).scalar_one()
    assert [(n["id"], n["status"]) for n in nodes] == [
        ("check", "completed"),
        ("sample", "completed"),
    ]


def test_a_person_s_step_is_not_the_agent_s_last_write(
    env: tuple[Runtime, RecordingDispatcher, Path],
) -> None:
    """`last_write` tells a working agent from a stuck one: a person's step, though a plan
    revision of the generation, leaves it at the agent's own last write."""
    rt, _, scripts = env
    task_id = waiting_on_a_sample(rt, scripts, callback=True)
    before = rt.tasks.explain(task_id)["last_write"]
    assert before is not None
    assert before["kind"] == "report"
    step = rt.human_steps.close(task_id, "sample", "completed", by="lab", evidence="0.4 mg/L")
    assert (step.task_status, step.generation) == ("waiting", 1)  # the call-back still open
    assert rt.tasks.explain(task_id)["last_write"] == before
