"""More dishonest agents, scripted, through the execution service over a real store and the real
tool host: each tries to get a task `completed` (or a node closed) on something the host cannot
show, and the host's verdict is read back. `test_dishonest_agents.py` holds the first set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services import executions
from orchestrator.services.tasks import Trigger
from orchestrator.tools.base import ToolResult
from tests.executions_support import (
    READ_AND_QUERY,
    RecordingHost,
    approve_the_action,
    kept_node,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)


@pytest.fixture
def rt(store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    RecordingHost.seen = []
    monkeypatch.setattr(executions, "ToolHost", RecordingHost)
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


def trigger(rt: Runtime) -> str:
    return rt.tasks.trigger(Trigger(task_type="lie", title="t")).task.task_id


def run(rt: Runtime, scripts: Path, task_id: str, generation: int, turns: list[Any]) -> Any:
    """Generation `generation` of the task plays `turns`; the task as `tasks show` sees it."""
    write_script(scripts, "lie", [*turns, {"content": "done"}])
    rt.executions.run(task_id, generation, worker="w1")
    return rt.tasks.explain(task_id)


def result_of(call_id: str) -> ToolResult:
    found = [r for c, r in RecordingHost.seen if c.id == call_id]
    assert found, f"call {call_id} was not made"
    return found[-1]


def codes(call_id: str) -> list[str]:
    """The codes of every problem the refused call `call_id` was told about."""
    result = result_of(call_id)
    assert result.status == "failed", result
    details = (result.payload or {}).get("details") or []
    return [p["code"] for p in details] or [str(result.code)]


def propose(call_id: str, node_id: str, text: str) -> dict[str, Any]:
    arguments = {"node_id": node_id, "kind": "work_order", "payload": {"text": text}}
    return {"id": call_id, "name": "propose_action", "arguments": arguments}


EDGE = [{"from": "notify", "to": "shut"}]

#: The first generation plans a trivial action node and a serious one, proposes the trivial
#: work order only, and waits for its approval.
FIRST_GENERATION = [
    READ_AND_QUERY,
    {"tool_calls": [plan_call("p1", "r1", [node("notify", "pending"), node("shut", "pending")])]},
    {"tool_calls": [propose("a1", "notify", "phone the customer")]},
    {"tool_calls": [report_call("rep", "waiting")]},
]


def test_a_node_cannot_borrow_the_approved_action_of_another_node(
    rt: Runtime, scripts: Path
) -> None:
    task_id = trigger(rt)
    assert run(rt, scripts, task_id, 1, FIRST_GENERATION)["status"] == "waiting"
    approve_the_action(rt, task_id)  # a person approved phoning the customer, nothing else
    approved = "${c0.result.actions.0.action_id}"
    borrowed = dict(node("shut", "completed"), action_id=approved)
    view = run(
        rt,
        scripts,
        task_id,
        2,
        [
            READ_AND_QUERY,
            # `shut` (the valve) claims the approval of `notify`'s work order.
            {"tool_calls": [plan_call("p2", "g2", [kept_node(0), borrowed], EDGE)]},
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    assert codes("p2") == ["unknown_action"]
    assert "proposed for node 'notify'" in result_of("p2").payload["details"][0]["message"]
    assert view["status"] != "completed"
    assert view["plan"] is None  # generation 2 wrote no plan


def test_a_node_may_still_complete_on_the_action_proposed_for_it(
    rt: Runtime, scripts: Path
) -> None:
    task_id = trigger(rt)
    run(rt, scripts, task_id, 1, FIRST_GENERATION)
    approve_the_action(rt, task_id)
    done = dict(node("notify", "completed"), action_id="${c0.result.actions.0.action_id}")
    view = run(
        rt,
        scripts,
        task_id,
        2,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("p2", "g2", [done, node("shut", "skipped")])]},
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    assert view["status"] == "completed", view["executions"]


def test_another_task_s_evidence_backs_neither_a_node_nor_a_report(
    rt: Runtime, scripts: Path
) -> None:
    other = trigger(rt)
    run(rt, scripts, other, 1, [{"tool_calls": [query_call()]}])
    foreign = result_of("q0").evidence_id  # a real record, of the other task
    assert foreign is not None
    task_id = trigger(rt)
    view = run(
        rt,
        scripts,
        task_id,
        1,
        [
            {"tool_calls": [plan_call("p1", "r1", [node("a", "completed", cite=[foreign])])]},
            {"tool_calls": [report_call("rep", "completed", cite=[foreign])]},
        ],
    )
    assert codes("p1") == ["unknown_evidence"]
    assert codes("rep") == ["unknown_evidence", "evidence_required"]
    assert view["status"] != "completed"
    assert view["plan"] is None
    assert view["report"] is None


def test_a_node_completed_first_cannot_take_an_action_after(rt: Runtime, scripts: Path) -> None:
    # The agent completes the valve node on a turbidity reading, then proposes the work order
    # for it: the node would stand completed whatever a person decides (here: rejected).
    task_id = trigger(rt)
    view = run(
        rt,
        scripts,
        task_id,
        1,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("p1", "r1", [node("shut", "completed")])]},
            {"tool_calls": [propose("a1", "shut", "shut the valve")]},
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    assert codes("a1") == ["node_closed"]
    assert "completed" in result_of("a1").message
    assert rt.actions.list(task_id=task_id) == []  # nothing written
    assert view["plan"]["revision"] == 1
    assert "action_id" not in view["plan"]["nodes"][0]


def test_a_look_alike_node_id_does_not_stand_in_for_a_human_step(
    rt: Runtime, scripts: Path
) -> None:
    # "\u0455ample" starts with a Cyrillic dze: to a reader, the person's sampling step,
    # completed by the agent. Ids are ASCII, so it is refused, and so is dropping the real one.
    task_id = trigger(rt)
    human = node("sample", "pending", actor="human")
    look_alike = dict(node("\u0455ample", "completed"), title=human["title"])
    view = run(
        rt,
        scripts,
        task_id,
        1,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("p1", "r1", [node("a", "completed"), human])]},
            {"tool_calls": [plan_call("p2", "r2", [node("a", "completed"), look_alike])]},
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    # The id's format is filed under the code of its length (plan_fields), with its message.
    assert codes("p2") == ["field_too_long", "node_removed"]
    assert "[A-Za-z0-9_.:-]" in result_of("p2").payload["details"][0]["message"]
    assert view["status"] == "waiting"
    assert [n["id"] for n in view["plan"]["nodes"]] == ["a", "sample"]


def test_an_approved_action_s_node_keeps_what_the_person_approved(
    rt: Runtime, scripts: Path
) -> None:
    task_id = trigger(rt)
    run(rt, scripts, task_id, 1, FIRST_GENERATION)
    approve_the_action(rt, task_id)  # phoning the customer, for the node `notify`
    # The node that carries the approval is renamed into the valve work, then completed.
    renamed = dict(kept_node_completed(), title="Shut valve V-12", description="shut it")
    view = run(
        rt,
        scripts,
        task_id,
        2,
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("p2", "g2", [renamed, node("shut", "skipped")], EDGE)]},
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    assert codes("p2") == ["action_node_changed"]
    assert view["status"] != "completed"
    assert view["plan"] is None  # generation 2 wrote no plan


def kept_node_completed() -> dict[str, Any]:
    """`notify` as generation 1 left it (with its action id), completed on the new query."""
    return dict(node("notify", "completed"), action_id="${c0.result.actions.0.action_id}")
