"""The agent runtime through the execution service, a real store and the scripted model: tool
discovery within the budget, compaction, context_overflow and read-only sub-agents.

The scripted model ignores what it is sent, so the requests are recorded by wrapping its
`next_turn` (the model still plays its script unchanged).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.compaction import PLAN_PREFIX
from orchestrator.agent.model import ModelTurn, ScriptedModel
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.executions_support import (
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import task_receipt_statuses
from tests.unit.test_compaction import assert_strict

Request = tuple[str, list[dict[str, Any]], list[dict[str, Any]]]

#: The evidence record the host wrote for the `a1` call_api read (the scripted model resolves it).
READ_CITED = "${a1.evidence_id}"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """Every request a scripted model got: (script name, messages, tools)."""
    requests: list[Request] = []
    play = ScriptedModel.next_turn

    def recording(
        self: ScriptedModel,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        requests.append((self.name, list(messages), list(tools)))
        return play(self, messages, tools, stop)

    monkeypatch.setattr(ScriptedModel, "next_turn", recording)
    return requests


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as running:
        yield running
        running.release.set()


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    document = json.loads(json.dumps(SPEC))
    document["paths"]["/settings/{key}"]["get"]["tags"] = ["settings", "pressure"]
    path = tmp_path / "backend.json"
    path.write_text(json.dumps(document))
    return path


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def api(call_id: str, operation_id: str, **arguments: Any) -> dict[str, Any]:
    return call(call_id, "call_api", operation_id=operation_id, arguments=arguments)


def trigger(rt: Runtime, task_type: str) -> str:
    return rt.tasks.trigger(Trigger(task_type=task_type, title="Low pressure")).task.task_id


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["name"] for tool in tools]


def test_discovery_within_the_budget(
    pg_url: str, tmp_path: Path, backend: Backend, spec: Path, sent: list[Request]
) -> None:
    scripts = tmp_path / "scripts"
    backend.settings["pressure"] = {"value": 5}  # the read the node and report cite
    write_script(
        scripts,
        "pressure",
        [
            {"tool_calls": [call("s1", "search_tools", search="createOrder 工单", limit=20)]},
            {"tool_calls": [call("s2", "search_tools", search="no such thing")]},
            {"tool_calls": [api("a1", "getSetting", key="pressure")]},
            {"tool_calls": [plan_call("p1", "r1", [node("a", "completed", cite=[READ_CITED])])]},
            {"tool_calls": [report_call("rep", "completed", cite=[READ_CITED])]},
        ],
    )
    window = 20_000
    rt, _ = runtime_for(
        pg_url,
        scripts,
        gateway_spec=spec,
        gateway_base_url=backend.url,
        llm_max_tools=1,
        llm_context_window=window,
        llm_max_output_tokens=1000,
    )
    try:
        task_id = trigger(rt, "pressure")
        assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
    finally:
        rt.close()
    assert backend.count("GET", "/settings/pressure") == 1
    resident = [
        "read_task_context",
        "publish_execution_plan",
        "propose_action",
        "save_report",
        "get_tool_execution",
        "read_tool_result",
        "search_tools",
        "delegate",
    ]
    counter = TokenCounter()
    budget = ContextBudget(window, 1000)
    first_tools = sent[0][2]
    # The first call: the resident tools and at most LLM_MAX_TOOLS=1 selected for the task.
    assert names(first_tools) == [*resident, "call_api"]
    (first_api,) = first_tools[len(resident) :]
    assert first_api["parameters"]["properties"]["operation_id"]["enum"] == ["getSetting"]
    # After the search: the candidates within min(4096, 10 % of 20,000) = 2,000 tokens.
    second_messages, second_tools = sent[1][1], sent[1][2]
    notice = second_messages[-1]["content"]
    assert notice.startswith("Tool discovery: enabled for this call: getSetting, createOrder")
    # The token count is the discovered tools' (the initial selection is outside the budget).
    assert "(discovered: createOrder, using " in notice
    assert " of 2000 extra-tool tokens; the initial selection is always offered)." in notice
    extra = second_tools[len(resident) :]
    assert sum(counter.schema(schema) for schema in extra) <= budget.extra_tools_tokens == 2000
    (second_api,) = extra
    assert set(second_api["parameters"]["properties"]["operation_id"]["enum"]) == {
        "getSetting",
        "createOrder",
    }
    # A search without a match adds nothing and brings no notice; nothing expands.
    assert names(sent[2][2]) == names(second_tools)
    assert not sent[2][1][-1]["content"].startswith("Tool discovery")
    for _, messages, tools in sent:
        assert counter.raw(messages, tools) <= budget.request_limit == 17_000


def test_compaction_keeps_the_plan_and_the_latest_transaction(
    pg_url: str, tmp_path: Path, sent: list[Request]
) -> None:
    scripts = tmp_path / "scripts"
    reads = [
        {"tool_calls": [call(f"r{k}a", "read_task_context"), call(f"r{k}b", "read_task_context")]}
        for k in range(12)
    ]
    write_script(
        scripts,
        "long",
        [
            {"tool_calls": [plan_call("p1", "r1", [node("a", "running"), node("b", "pending")])]},
            *reads,
            # The evidence the nodes cite, queried last so that it is the latest transaction
            # (kept whole by compaction); two rows, small beside the 6,000-token window.
            {
                "tool_calls": [
                    query_call() | {"arguments": query_call()["arguments"] | {"max_rows": 2}}
                ]
            },
            {
                "tool_calls": [
                    plan_call("p2", "r2", [node("a", "completed"), node("b", "completed")])
                ]
            },
            {"tool_calls": [report_call("rep", "completed")]},
        ],
    )
    rt, _ = runtime_for(pg_url, scripts, llm_context_window=6000, llm_max_output_tokens=500)
    try:
        task_id = trigger(rt, "long")
        assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
    finally:
        rt.close()
    counter, budget = TokenCounter(), ContextBudget(6000, 500)
    summaries = 0
    for number, (_, messages, tools) in enumerate(sent):
        assert_strict(messages)
        assert counter.raw(messages, tools) <= budget.request_limit
        if number >= 1:  # after the first publish, the plan is its own message on every call
            assert messages[2]["content"].startswith(PLAN_PREFIX)
        summaries += any("compacted" in str(m.get("content")) for m in messages[3:4])
    assert summaries, "the history must have been compacted"
    last = sent[-2][1]  # the call after the second publish
    # The latest transaction (the second publish and its result) is whole, and the plan
    # message carries its revision.
    assert last[-2]["tool_calls"][0]["id"] == "p2"
    assert last[-1]["tool_call_id"] == "p2"
    assert '"revision": 2' in last[2]["content"]
    # The first publish was compacted away; its plan survives only as the plan message.
    assert all(m.get("tool_call_id") != "p1" for m in last)


def test_a_large_plan_is_kept_whole_in_the_plan_message(
    pg_url: str, tmp_path: Path, sent: list[Request]
) -> None:
    scripts = tmp_path / "scripts"
    nodes = [node(f"n{k}", "pending") for k in range(30)]  # its result is paged (a preview)
    write_script(
        scripts,
        "big",
        [{"tool_calls": [plan_call("p1", "r1", nodes)]}, {"content": "planned"}],
    )
    rt, _ = runtime_for(pg_url, scripts)
    try:
        rt.executions.run(trigger(rt, "big"), 1, worker="w")
    finally:
        rt.close()
    shown = json.loads(sent[1][1][-1]["content"])
    assert shown["result"]["truncated"] is True
    message = sent[1][1][2]["content"]
    assert message.startswith(PLAN_PREFIX)
    plan = json.loads(message[len(PLAN_PREFIX) :])
    assert [n["id"] for n in plan["nodes"]] == [f"n{k}" for k in range(30)]


def test_an_oversized_fixed_part_fails_with_context_overflow(pg_url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    write_script(scripts, "tiny", [{"tool_calls": [call("c1", "read_task_context")]}])
    rt, _ = runtime_for(pg_url, scripts, llm_context_window=1024, llm_max_output_tokens=100)
    try:
        task_id = trigger(rt, "tiny")
        result = rt.executions.run(task_id, 1, worker="w")
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    assert result.outcome == "failed"
    assert view["status"] == "failed"
    assert view["failure_code"] == "context_overflow"
    assert "context window of 1024 tokens is too small" in view["last_error"]


def sub_agent_scripts(scripts: Path, task_type: str, outcome: str = "continue") -> None:
    """A round that delegates, keeps its node running and continues; its sub-agent reads, then
    tries a write, a plan, a report and a delegation, and answers."""
    write_script(
        scripts,
        task_type,
        [
            {"tool_calls": [call("d1", "delegate", question="What is the pressure setting?")]},
            {"tool_calls": [plan_call("p1", "r1", [node("a", "running")])]},
            {"tool_calls": [report_call("rep", outcome)]},
        ],
    )
    write_script(
        scripts,
        f"{task_type}.subagent",
        [
            {"tool_calls": [api("s1", "getSetting", key="pressure")]},
            {"tool_calls": [api("s2", "putSetting", key="pressure", body={"value": 9})]},
            {"tool_calls": [plan_call("s3", "sub", [node("x", "completed")])]},
            {"tool_calls": [report_call("s4", "completed"), call("s5", "delegate", question="q")]},
            {"content": "the pressure setting is 5"},
        ],
    )


def test_a_sub_agent_write_is_refused_at_the_host_and_two_rounds_delegate(
    pg_url: str, tmp_path: Path, backend: Backend, spec: Path, sent: list[Request]
) -> None:
    scripts = tmp_path / "scripts"
    sub_agent_scripts(scripts, "probe")
    backend.settings["pressure"] = {"value": 5}
    rt, dispatcher = runtime_for(
        pg_url, scripts, gateway_spec=spec, gateway_base_url=backend.url, max_rounds=2
    )
    try:
        task_id = trigger(rt, "probe")
        assert rt.executions.run(task_id, 1, worker="w").outcome == "continue"
        assert dispatcher.sent[-1] == (task_id, 2)
        assert rt.executions.run(task_id, 2, worker="w").ran  # the next round delegates again
        view = rt.tasks.explain(task_id)
        receipts = task_receipt_statuses(rt.db, task_id)
    finally:
        rt.close()
    assert [e["generation"] for e in view["executions"]] == [1, 2]
    assert backend.count("GET", "/settings/pressure") == 2  # one read per round's sub-agent
    assert backend.count("PUT", "/settings/pressure") == 0  # the write never left the host
    assert receipts == []  # nor was a receipt claimed for it
    assert view["plan"]["nodes"][0]["id"] == "a"  # the sub-agent's plan was refused
    sub_requests = [r for r in sent if r[0] == "probe.subagent.json"]
    parent_requests = [r for r in sent if r[0] == "probe.json"]
    assert len(sub_requests) == 2 * 5
    # Discovery is off (LLM_MAX_TOOLS=0): the parent is offered every tool, as the host lists.
    assert "search_tools" not in names(parent_requests[0][2])
    (api,) = [tool for tool in parent_requests[0][2] if tool["name"] == "call_api"]
    assert "putSetting" in api["description"]
    # The sub-agent is offered read tools only...
    assert names(sub_requests[0][2]) == [
        "read_task_context",
        "get_tool_execution",
        "read_tool_result",
        "query_data_source",
        "describe_api_operation",
        "call_api",
    ]
    assert sub_requests[0][2][5]["parameters"]["properties"]["operation_id"]["enum"] == [
        "getSetting",
        "bigReport",
    ]
    assert "putSetting" not in sub_requests[0][2][5]["description"]
    assert "getSecret" not in sub_requests[0][2][5]["description"]  # sensitive_read
    # ...and is refused at the host whatever it calls, with what it may call instead.
    refusals = [json.loads(m["content"]) for m in sub_requests[4][1] if m["role"] == "tool"]
    statuses = [(r["status"], r.get("code")) for r in refusals]
    assert statuses == [("succeeded", None)] + [("failed", "readonly")] * 4
    assert "It may call instead: read_task_context" in refusals[1]["message"]
    # The parent gets the answer and what the sub-agent's calls came to, in both rounds.
    for round_start in (0, 4):
        answer = json.loads(parent_requests[round_start + 1][1][-1]["content"])
        assert answer["status"] == "succeeded"
        assert answer["result"]["answer"] == "the pressure setting is 5"
        assert [c.get("code") for c in answer["result"]["tool_calls"]] == [
            None,
            "readonly",
            "readonly",
            "readonly",
            "readonly",
        ]
