"""A model that fails the same way again and again stops early, saying why; one that makes
progress does not. Through the real `openai` client against the loopback server and a real
store and its generations.

Before, a model that sent the same refused call every turn spent ORCH_MAX_TURNS turns in each
of ORCH_MAX_ROUNDS rounds (here 8 x 3 = 24 requests) and failed `round_limit`; a server that
answered every round's first request with nothing ran every round to the round limit. Now the
same refusal `SAME_FAILURE_LIMIT` turns in a row (or each of refusals made in turn that many
times with nothing new run in between), or the same empty answer that many rounds in a row of
rounds that made the same calls, ends the task `model_error` naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.agent.repeats import SAME_FAILURE_LIMIT
from orchestrator.api.app import create_app
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from tests.executions_support import runtime_for
from tests.openai_server import OpenAIServer, Reply, call

#: A query the source refuses (its parameters are not the source's): the same answer each time.
BAD = {"source": "scada_sim", "parameters": {"point": "nowhere"}}
GOOD = {"source": "scada_sim", "parameters": {"point": "DM-RN-01", "measure": "turbidity"}}


def _runtime(store_url: str, scripts: Path, server: OpenAIServer) -> Any:
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        max_rounds=3,
        max_turns=8,
    )
    return rt


def _trigger(rt: Any) -> str:
    return rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id


@pytest.mark.parametrize("reads_first", [False, True], ids=["alone", "after_a_read"])
def test_the_same_refused_call_turn_after_turn_ends_the_task_naming_it(
    store_url: str, scripts: Path, server: OpenAIServer, reads_first: bool
) -> None:
    """Also when the model reads the task's context again before each refused call: the read
    runs, the turn is the same again."""
    rt = _runtime(store_url, scripts, server)
    try:
        server.converse(
            [
                Reply(
                    tool_calls=[call(f"r{n}", "read_task_context", {})] * reads_first
                    + [call(f"c{n}", "query_data_source", BAD)]
                )
                for n in range(20)
            ]
        )
        task_id = _trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        view = rt.tasks.explain(task_id)
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    assert result.outcome == "failed"
    assert view["failure_code"] == "model_error"
    assert view["last_error"].startswith(
        f"the model made the same refused call {SAME_FAILURE_LIMIT} turns in a row, shown why "
        "each time: query_data_source: invalid_arguments: scada_sim takes point"
    )
    assert "ORCH_MAX_TURNS" in view["last_error"]
    assert len(server.requests) == SAME_FAILURE_LIMIT  # not 8 turns x 3 rounds
    # Every refused call and what the model was told are in the transcript.
    results = [e["status"] for e in entries if e["kind"] == "tool_result"]
    assert results == (["succeeded"] * reads_first + ["failed"]) * SAME_FAILURE_LIMIT


#: A source the store does not declare: refused `unknown_source`, the same answer each time.
NOWHERE = {"source": "nowhere"}


@pytest.mark.parametrize(
    "cycle",
    [
        [("query_data_source", BAD), ("query_data_source", NOWHERE)],
        [("query_data_source", BAD), ("save_reprt", {}), ("query_data_source", NOWHERE)],
    ],
    ids=["two", "three"],
)
def test_refused_calls_in_turn_ends_the_task_naming_them(
    store_url: str, scripts: Path, server: OpenAIServer, cycle: list[tuple[str, Any]]
) -> None:
    """A model that alternates between refused calls (A, B, A, B, ...; or cycles among three),
    shown why each time, makes no turn the same as the one before it. Before, it spent every
    round's 8 turns and the task all 3 rounds (24 requests) before `round_limit`; now the
    round ends once each refusal of a turn came `SAME_FAILURE_LIMIT` times with nothing new run
    in between, naming them all."""
    rt = _runtime(store_url, scripts, server)
    try:
        server.converse(
            [Reply(tool_calls=[call(f"c{n}", *cycle[n % len(cycle)])]) for n in range(30)]
        )
        task_id = _trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    turns = len(cycle) * (SAME_FAILURE_LIMIT - 1) + 1
    assert result.outcome == "failed"
    assert view["failure_code"] == "model_error"
    assert len(server.requests) == turns  # not 8 turns x 3 rounds
    assert view["last_error"].startswith(
        f"the model made the same {len(cycle)} refused calls in turn, {turns} turns with "
        "nothing new run in between, shown why each time: query_data_source: invalid_arguments: "
        "scada_sim takes point"
    )
    assert "query_data_source: unknown_source: unknown source 'nowhere'" in view["last_error"]
    assert ("save_reprt: unknown_tool: unknown tool 'save_reprt'" in view["last_error"]) == (
        len(cycle) == 3
    )
    assert "ORCH_MAX_TURNS" in view["last_error"]


def test_a_model_that_corrects_its_call_between_refusals_goes_on(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Refused twice, then a call that runs, then refused twice again, then another refusal
    twice: no run of three, and the round ends as the model ends it."""
    turns = [BAD, BAD, GOOD, BAD, BAD, NOWHERE]
    rt = _runtime(store_url, scripts, server)
    try:
        server.converse(
            [
                Reply(tool_calls=[call(f"c{n}", "query_data_source", args)])
                for n, args in enumerate(turns)
            ]
            + [Reply(content="the water is fine")]
        )
        task_id = _trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
    finally:
        rt.close()
    assert result.outcome == "continue", result.detail
    assert result.detail == "the round saved no report"
    assert len(server.requests) == len(turns) + 1


def test_the_same_empty_answer_round_after_round_ends_the_task_naming_it(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt, _ = runtime_for(
        store_url, scripts, model="openai:test-model", llm_base_url=server.base_url, max_rounds=5
    )
    try:
        server.converse([Reply(content=None)])  # every round's first request: nothing
        task_id = _trigger(rt)
        outcomes = []
        for generation in range(1, SAME_FAILURE_LIMIT + 1):
            outcomes.append(rt.executions.run(task_id, generation, worker="w1").outcome)
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    assert outcomes == ["continue"] * (SAME_FAILURE_LIMIT - 1) + ["failed"]
    assert view["status"] == "failed"
    assert view["failure_code"] == "model_error"  # not round_limit, 2 rounds early
    assert view["last_error"].startswith(
        "the model returned an empty answer (no text and no tool call) to the round's first "
        f"request in {SAME_FAILURE_LIMIT} rounds in a row, saving no report"
    )
    assert len(server.requests) == SAME_FAILURE_LIMIT


POINTS = ["DM-RN-01", "DM-RN-02", "DM-HS-01", "DM-RN-01"]


@pytest.mark.parametrize("new_reads", [False, True], ids=["same_reads", "new_reads"])
def test_an_empty_answer_after_work_ends_the_task_only_when_the_rounds_did_the_same(
    store_url: str, scripts: Path, server: OpenAIServer, new_reads: bool
) -> None:
    """Each round queries a source, then answers nothing at turn 2. Rounds that make the same
    query each time are stuck (the next is asked the same and does the same): the third ends
    the task model_error. Before, rounds that each queried something new ended the same way,
    at the third, though each made progress; now they go on, to the round limit."""
    rt, _ = runtime_for(
        store_url, scripts, model="openai:test-model", llm_base_url=server.base_url, max_rounds=4
    )
    try:
        for n, point in enumerate(POINTS):
            query = {
                "source": "scada_sim",
                "parameters": {"point": point if new_reads else "DM-RN-01", "measure": "pressure"},
            }
            server.reply(tool_calls=[call(f"q{n}", "query_data_source", query)])
            server.reply(content=None)
        task_id = _trigger(rt)
        outcomes = []
        for generation in range(1, len(POINTS) + 1):
            result = rt.executions.run(task_id, generation, worker="w1")
            outcomes.append(result.outcome)
            if result.outcome == "failed":
                break
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    said = "the model returned an empty answer (no text and no tool call) at turn 2 of the round"
    if not new_reads:
        assert outcomes == ["continue"] * (SAME_FAILURE_LIMIT - 1) + ["failed"]
        assert view["failure_code"] == "model_error"
        assert view["last_error"].startswith(f"{said}, after 1 turn(s) of tool calls in 3 rounds")
        return
    assert outcomes == ["continue"] * (len(POINTS) - 1) + ["failed"]
    assert view["failure_code"] == "round_limit"
    assert view["last_error"] == (
        f"the task did not finish within {len(POINTS)} rounds; in the last round {said}, "
        "after 1 turn(s) of tool calls"
    )


def test_a_collaboration_stops_at_the_same_refusal_and_shows_no_key(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A collaboration's model has the same loop of turns (ORCH_MAX_TURNS, 30 by default): the
    same refusal ends it `502 model_error` naming it. Its tool host masked no result: a task
    context holding the model's key was shown to the model as it was."""
    key = "sk-collaboration-9"
    rt, _ = runtime_for(store_url, scripts)
    try:
        task_id = rt.tasks.trigger(
            Trigger(task_type="looks", title="turbid water", context={"lab_key": key})
        ).task.task_id
    finally:
        rt.close()
    settings = load_settings(
        database_url=store_url,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=key,
        llm_max_retries=0,
    )
    server.reply(tool_calls=[call("q0", "read_task_context", {})])
    server.converse(
        [
            Reply(tool_calls=[call(f"q{n}", "read_task_context", {"evidence_skip": -1})])
            for n in range(1, 20)
        ]
    )
    with TestClient(create_app(settings)) as client:
        session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
        asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Why?"})
    assert (asked.status_code, asked.json()["error"]["code"]) == (502, "model_error")
    assert (
        f"the model made the same refused call {SAME_FAILURE_LIMIT} turns in a row, shown why "
        "each time: read_task_context: invalid_arguments: "
    ) in asked.json()["error"]["message"]
    assert len(server.requests) == 1 + SAME_FAILURE_LIMIT
    (context,) = [m for m in server.bodies[1]["messages"] if m["role"] == "tool"]
    assert key not in context["content"]
    assert "***" in context["content"]


def test_the_reason_keeps_no_key_the_model_wrote_as_a_tools_name(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """The reason names the refused call's tool as the model wrote it, and is the task's
    error that the API and the console serve."""
    key = "sk-never-shown"
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=key,
        max_rounds=3,
        max_turns=8,
    )
    try:
        server.converse([Reply(tool_calls=[call(f"c{n}", f"login_{key}", {})]) for n in range(20)])
        task_id = _trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").outcome == "failed"
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    assert view["failure_code"] == "model_error"
    assert (
        "shown why each time: login_***: unknown_tool: unknown tool 'login_***'"
        in (view["last_error"])
    )
    assert key not in view["last_error"]
