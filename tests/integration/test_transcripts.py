"""The durable transcript, token usage and recovery snapshots, in-process over a real store.

The execution service runs rounds with the real OpenAI client against the loopback server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from sqlalchemy import select, update

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import LeaseLost, run_round
from orchestrator.agent.model import Model, ModelTurn, ScriptedModel, TokenUsage, _ScriptTurn
from orchestrator.agent.openai_model import OpenAIModel
from orchestrator.agent.request import TRANSCRIPT, AgentContext
from orchestrator.agent.subagents import RoundDelegations, SubAgentRun
from orchestrator.agent.transcript import REDACTED, TranscriptWriter
from orchestrator.cli.tasks import render_explain, render_transcript
from orchestrator.domain.recovery import Snapshot
from orchestrator.errors import StaleGeneration
from orchestrator.runtime import Runtime
from orchestrator.services.cleanup import run_cleanup
from orchestrator.services.recovery import save_round_snapshot
from orchestrator.services.tasks import Trigger
from orchestrator.store import snapshots as snapshot_store
from orchestrator.store import tasks as task_store
from orchestrator.store.tables import tasks, transcript_entries
from orchestrator.store.types import utcnow
from orchestrator.tools.base import (
    CALL_ID,
    Fence,
    Tool,
    ToolArguments,
    ToolCall,
    ToolContext,
    ToolResult,
)
from tests.executions_support import (
    claim_as_worker,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    wait_for,
)
from tests.openai_server import OpenAIServer, Reply, call
from tests.tool_threads import join_tool_threads


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


def openai_runtime(store_url: str, scripts: Path, server: OpenAIServer, **extra: Any) -> Runtime:
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key="sk-never-shown",
        llm_max_retries=1,
        **extra,
    )
    return rt


def as_call(raw: dict[str, Any]) -> dict[str, Any]:
    """A scripted-model call (`tests.executions_support`) as a server tool call."""
    return call(raw["id"], raw["name"], raw["arguments"])


def trigger(rt: Runtime, task_type: str = "water") -> str:
    return rt.tasks.trigger(Trigger(task_type=task_type, title="Turbid water")).task.task_id


def test_a_round_on_the_openai_model_completes_with_its_transcript_and_usage(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            tool_calls=[call("c1", "read_task_context", {}), as_call(query_call())], usage=(300, 10)
        )
        server.reply(
            tool_calls=[as_call(plan_call("c2", "r1", [node("a", "completed", evidence="e")]))],
            reasoning_content="the context says one site",
            usage=(500, 40),
        )
        server.reply(tool_calls=[as_call(report_call("c3", "completed"))], usage=(700, 30))
        server.reply(content="done", usage=(800, 2))
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "completed", result.detail

        view = rt.tasks.transcript(task_id)
        kinds = [(e["kind"], e.get("call_id")) for e in view["items"]]
        assert kinds == [
            ("model_turn", None),
            ("tool_result", "c1"),
            ("tool_result", "q0"),
            ("model_turn", None),
            ("tool_result", "c2"),
            ("model_turn", None),
            ("tool_result", "c3"),
            ("model_turn", None),
        ]
        first = view["items"][0]
        assert first["body"]["tool_calls"][0]["name"] == "read_task_context"
        assert first["usage"] == {"prompt_tokens": 300, "completion_tokens": 10}
        assert view["items"][3]["body"]["reasoning_content"] == "the context says one site"
        # The result as the model was shown it, the same envelope the server received.
        shown = json.loads(server.bodies[1]["messages"][3]["content"])
        assert view["items"][1]["body"] == json.loads(json.dumps(shown))

        usage = rt.tasks.explain(task_id)["token_usage"]
        assert usage["generations"] == [
            {"generation": 1, "calls": 4, "prompt_tokens": 2300, "completion_tokens": 82}
        ]
        assert usage["total"]["prompt_tokens"] == 2300
        assert rt.tasks.transcript(task_id, generation=1)["items"] == view["items"]
    finally:
        rt.close()


def test_the_usage_of_summary_calls_is_part_of_the_execution_s_usage(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(
        store_url,
        scripts,
        server,
        # Small enough that twelve turns of reads are compacted, large enough for the fixed
        # part of a request (system prompt, brief, tools: about 2,500 tokens).
        llm_context_window=3300,
        llm_max_output_tokens=500,
        max_turns=14,
    )
    try:
        reads = [
            Reply(
                tool_calls=[
                    call(f"r{k}a", "read_task_context", {}),
                    call(f"r{k}b", "read_task_context", {}),
                ]
            )
            for k in range(12)
        ]
        # A summary request renders the old turns ("[tool result r0a] ...").
        server.converse([Reply(content="the reads agree")], mentioning="[tool result")
        server.converse([*reads, Reply(content="read enough")], mentioning="Turbid water")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome != "failed", result.detail  # the fixed prompt fits the window
        entries = rt.tasks.transcript(task_id)["items"]
        summaries = [e for e in entries if e["kind"] == "summary"]
        assert summaries, "the history must have been compacted"
        assert all(e["body"]["source"] == "model" for e in summaries)
        assert all(e["usage"]["prompt_tokens"] > 0 for e in summaries)
        # Every call the server answered is counted, the summary calls too.
        usage = rt.tasks.explain(task_id)["token_usage"]["generations"][0]
        assert usage["calls"] == len(server.bodies)
        assert usage["prompt_tokens"] == sum(
            len(json.dumps(body["messages"])) // 4 for body in server.bodies
        )
    finally:
        rt.close()


def test_an_exhausted_retry_budget_fails_the_round_with_model_error(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.fail(503, retry_after=0)
        server.fail(503, retry_after=0)
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "failed"
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "model_error"
        reason = view["executions"][0]["reason"]
        assert "HTTP 503" in reason
        assert "LLM_MAX_RETRIES=1" in reason
        assert "sk-never-shown" not in json.dumps(view, default=str)
    finally:
        rt.close()


def test_a_reply_cut_at_max_tokens_is_recorded_as_cut_and_fails_the_round_saying_so(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """finish_reason=length without tool calls was taken for the final answer: the round
    ended 'saved no report' and the task ran round after round on half a sentence."""
    rt = openai_runtime(store_url, scripts, server, llm_max_output_tokens=512)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(content="The turbidity rose after the bu", finish_reason="length")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "failed"
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "model_error"
        reason = view["executions"][0]["reason"]
        assert "cut off at LLM_MAX_OUTPUT_TOKENS=512" in reason
        page = rt.tasks.transcript(task_id)
        last = page["items"][-1]
        assert last["kind"] == "model_turn"
        assert last["body"]["content"] == "The turbidity rose after the bu"
        assert "finish_reason=length" in last["body"]["cut_off"]
        shown = render_transcript(page)
        assert "model: The turbidity rose after the bu" in shown
        assert "(cut off: the model's reply was cut off at LLM_MAX_OUTPUT_TOKENS=512" in shown
    finally:
        rt.close()


class SecretArgs(ToolArguments):
    user: str = Field(min_length=1)
    filters: dict[str, Any] = Field(default_factory=dict)


class ReadSecret(Tool):
    name = "read_secret"
    description = "a sensitive read"
    effect = "sensitive_read"
    arguments = SecretArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"password": "hunter2"})


def claimed(rt: Runtime) -> tuple[Fence, str]:
    task_id = trigger(rt)
    token = claim_as_worker(rt, task_id, 1, "w1", ttl=60)
    with rt.db.transaction(readonly=True) as conn:
        task = task_store.get_task(conn, task_id)
    assert task is not None
    assert task.session_id is not None
    return Fence(task_id, 1, token), task.session_id


def test_sensitive_arguments_and_bodies_are_redacted(store_url: str, scripts: Path) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {"read_secret": ReadSecret()})
        secret_call = ToolCall("s1", "read_secret", {"user": "alice", "filters": {"a": [1, 2]}})
        turn = ModelTurn(None, (secret_call,), usage=TokenUsage(5, 1))
        writer.model_turn(1, {}, turn)
        writer.tool_results(1, [secret_call], [ToolResult.ok({"password": "hunter2"})])
        writer.flush()  # results are written in the background
        stored = json.dumps(rt.tasks.transcript(fence.task_id)["items"])
        assert "alice" not in stored
        assert "hunter2" not in stored
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert entries[0]["body"]["tool_calls"][0]["arguments"] == {
            "user": REDACTED,
            "filters": {"a": [REDACTED, REDACTED]},
        }
        assert entries[1]["status"] == "succeeded"
    finally:
        rt.close()


def test_a_query_result_is_kept_as_shown_and_only_a_page_is_left_out(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[as_call(query_call("q1"))])
        server.reply(content="done")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.ran, result.detail
        entries = rt.tasks.transcript(task_id)["items"]
        by_call = {e["call_id"]: e for e in entries if e["kind"] == "tool_result"}
        # The query (not paged: its declared limit bounds it) is the envelope the model saw.
        shown = json.loads(server.bodies[1]["messages"][-1]["content"])
        assert shown["result"]["rows"]
        assert by_call["q1"]["body"] == json.loads(json.dumps(shown))
        # A page read with read_tool_result is not kept, only which one was read.
        pager = rt.executions.receipt_tools
        tools = {t.name: t for t in pager}
        writer = TranscriptWriter(rt.db, Fence(task_id, 1, "x"), "s", tools)
        page = ToolCall("p1", "read_tool_result", {"result_id": "r1", "offset": 10})
        kept = writer.envelope(page, ToolResult.ok({"text": "the page itself"}))
        assert "the page itself" not in json.dumps(kept)
        assert kept["result"]["arguments"] == {"result_id": "r1", "offset": 10}
    finally:
        rt.close()


def test_a_call_id_longer_than_the_transcript_keeps_does_not_stop_the_round(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[call("c" * 300, "read_task_context", {})])
        server.reply(content="done")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "continue", result.detail  # no report: not an infra error
        entries = rt.tasks.transcript(task_id)["items"]
        called = entries[0]["body"]["tool_calls"][0]["id"]
        assert len(called) <= 128
        assert entries[1]["call_id"] == called
        assert server.bodies[1]["messages"][-1]["tool_call_id"] == called
    finally:
        rt.close()


def test_nul_and_lone_surrogates_from_the_model_or_a_tool_do_not_stop_the_round(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            content="looking\u0000 at \ud800 it",
            reasoning_content="nul\u0000",
            tool_calls=[call("c1", "read_task_context", {})],
        )
        server.reply(
            tool_calls=[call("c\u0000" + "x" * 200, "\u0000" + "n" * 300, {"k\u0000": "\udfff"})]
        )
        server.reply(content="done\u0000")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "continue", result.detail  # no report: not a stopped round
        entries = rt.tasks.transcript(task_id)["items"]
        assert [e["kind"] for e in entries] == [
            "model_turn",
            "tool_result",
            "model_turn",
            "tool_result",
            "model_turn",
        ]
        assert entries[0]["body"]["content"] == "looking\ufffd at \ufffd it"
        assert entries[0]["body"]["reasoning_content"] == "nul\ufffd"
        assert entries[2]["body"]["tool_calls"][0]["arguments"] == {"k\ufffd": "\ufffd"}
        assert entries[3]["tool_name"] == "\ufffd" + "n" * 127
        assert entries[3]["status"] == "failed"  # an unknown tool
        assert entries[4]["body"]["content"] == "done\ufffd"
        # A tool's output may hold NUL too (a command printing binary data).
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        binary = ToolCall("b1", "t", {})
        writer.model_turn(1, {}, ModelTurn(None, (binary,)))
        writer.tool_results(1, [binary], [ToolResult.ok({"out": "\x7fELF\x00\x01"})])
        writer.flush()
        stored = rt.tasks.transcript(fence.task_id)["items"]
        assert stored[-1]["body"]["result"] == {"out": "\x7fELF\ufffd\x01"}
    finally:
        rt.close()


def test_results_written_in_the_background_come_before_the_next_turn(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        for number in range(1, 6):
            calls = [ToolCall(f"c{number}a", "t", {}), ToolCall(f"c{number}b", "t", {})]
            writer.model_turn(number, {}, ModelTurn(None, tuple(calls)))
            writer.tool_results(number, calls, [ToolResult.ok(number)] * 2)
        writer.model_turn(6, {}, ModelTurn("done", ()))
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert [(e["turn"], e["kind"]) for e in entries] == [
            *(
                (n, kind)
                for n in range(1, 6)
                for kind in ("model_turn", "tool_result", "tool_result")
            ),
            (6, "model_turn"),
        ]
        # A refused background write surfaces at the next step of the round.
        calls = [ToolCall("late", "t", {})]
        writer.model_turn(7, {}, ModelTurn(None, tuple(calls)))
        rt.tasks.requeue(fence.task_id, "operator")
        writer.tool_results(7, calls, [ToolResult.ok(7)])
        with pytest.raises(StaleGeneration):
            writer.flush()
    finally:
        rt.close()


def test_a_superseded_generation_writes_no_transcript(store_url: str, scripts: Path) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        rt.tasks.requeue(fence.task_id, "operator")
        with pytest.raises(StaleGeneration):
            writer.model_turn(1, {}, ModelTurn("hello", ()))
        assert rt.tasks.transcript(fence.task_id)["items"] == []
    finally:
        rt.close()


class _ReadArgs(ToolArguments):
    pass


class ReadRows(Tool):
    name = "read_rows"
    description = "read many rows"
    arguments = _ReadArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"rows": ["reading " * 150]})


class DoubtDuringSummary(Model):
    """Reads until the history is compacted; the lease comes into doubt during the summary
    call (the lease keeper sets the stop event while the model thinks)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.turns = 0

    def next_turn(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], stop: Any
    ) -> ModelTurn:
        self.turns += 1
        return ModelTurn(None, (ToolCall(f"c{self.turns}", "read_rows", {}),))

    def summary_turn(self, messages: Sequence[dict[str, Any]], stop: Any) -> ModelTurn | None:
        self.stop.set()
        return ModelTurn("a summary written after the lease came into doubt", ())


def test_a_round_whose_lease_is_in_doubt_writes_no_more_transcript_entries(
    store_url: str, scripts: Path
) -> None:
    """Once the stop event is set the writer does not try: no summary entry, although the
    fence (not superseded yet) would still have taken it."""
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        stop = threading.Event()
        writer = TranscriptWriter(rt.db, fence, session_id, {}, stop=stop)
        with pytest.raises(LeaseLost):
            run_round(
                DoubtDuringSummary(stop),
                ToolHost([ReadRows()], ledger=None),
                ToolContext(owner="o", session_id=session_id, round_id="r"),
                brief="find the leak",
                max_turns=20,
                stop=stop,
                recorder=writer,
                context=AgentContext(ContextBudget(3000, 200), TokenCounter()),
                transcript=writer,
            )
        writer.flush()
        entries = rt.tasks.transcript(fence.task_id)["items"]
        kinds = [e["kind"] for e in entries]
        assert "model_turn" in kinds  # the turns before the doubt were written
        assert "summary" not in kinds, kinds
        with rt.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, fence.task_id)
        assert task is not None
        assert (task.generation, task.status) == (1, "running")  # the fence still stands
    finally:
        rt.close()


def test_a_stopped_writer_writes_nothing_and_still_remembers_what_came_back(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        stop = threading.Event()
        writer = TranscriptWriter(rt.db, fence, session_id, {}, stop=stop)
        calls = [ToolCall("a", "t", {}), ToolCall("b", "t", {})]
        writer.model_turn(1, {}, ModelTurn(None, tuple(calls)))
        stop.set()
        # The results that came back after the doubt: in the snapshot, not in the store.
        writer.tool_results(1, calls[:1], [ToolResult.ok(1)])
        writer.flush()
        with pytest.raises(LeaseLost):
            writer.model_turn(2, {}, ModelTurn(None, (ToolCall("c", "t", {}),)))
        child = writer.child("a")
        with pytest.raises(LeaseLost):
            child.model_turn(1, {}, ModelTurn("a sub-agent's answer", ()))
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert [(e["turn"], e["kind"]) for e in entries] == [(1, "model_turn")]
        snapshot = writer.snapshot("stopped: lease lost", None)
        assert [c["call_id"] for c in snapshot.received] == ["a"]
        assert [c["call_id"] for c in snapshot.unknown] == ["b"]  # "c" never ran
    finally:
        rt.close()


def test_a_snapshot_from_memory_wins_over_one_from_the_transcript(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        calls = (ToolCall("a", "count", {}), ToolCall("b", "write_it", {"x": 1}))
        writer.model_turn(1, {}, ModelTurn(None, calls))
        writer.calls["a"] = writer.calls["a"].answered("succeeded", None)
        snapshot = save_round_snapshot(rt.db, writer, "stopped: lease lost")
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.received] == ["a"]
        assert [(c["call_id"], c["status"]) for c in snapshot.unknown] == [("b", "unknown")]
        with rt.db.transaction() as conn:
            stored = snapshot_store.get_snapshot(conn, session_id)
            assert stored is not None
            assert stored.unknown == snapshot.unknown
            assert not snapshot_store.save_snapshot(conn, session_id, snapshot, replace=False)
    finally:
        rt.close()


@pytest.mark.slow
def test_a_cancel_during_a_command_leaves_the_call_unknown_and_the_next_generation_sees_it(
    store_url: str, scripts: Path, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    rt = openai_runtime(store_url, scripts, server, enable_command_tool=True)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(tool_calls=[call("c2", "execute_command", {"command": "sleep 30"})])
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        # The command is running once its model turn is in the transcript.
        wait_for(
            lambda: len(rt.tasks.transcript(task_id)["items"]) >= 3, 10, what="the command turn"
        )
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=20)
        assert not worker.is_alive()
        assert results[0].ran
        assert "stopped" in results[0].detail
        # The fence refusing the stopped command's receipt is the usual end of a cancel: no
        # error with a traceback in the worker's log.
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [(c["call_id"], c["tool"]) for c in snapshot.unknown] == [("c2", "execute_command")]
        assert [c["call_id"] for c in snapshot.received] == ["c1"]
        # Operators see it in the explain view (`tasks show`).
        view = rt.tasks.explain(task_id)
        assert [c["call_id"] for c in view["recovery"]["unknown"]] == ["c2"]
        assert "unknown: c2 execute_command" in render_explain(view)
        requests = len(server.requests)

        # A requeue starts generation 2, whose context opens with the snapshot; nothing replays.
        rt.tasks.requeue(task_id, "continue after the cancel")
        server.reply(tool_calls=[call("d1", "read_task_context", {})])
        server.reply(content="stopping here")
        rt.executions.run(task_id, 2, worker="w1")
        context = json.loads(server.bodies[-1]["messages"][-1]["content"])["result"]
        assert next(iter(context)) == "recovery"
        assert [c["call_id"] for c in context["recovery"]["unknown"]] == ["c2"]
        assert context["recovery"]["verify_first"]
        assert len(server.requests) == requests + 2
        commands = [
            c
            for body in server.bodies[requests:]
            for m in body["messages"]
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "execute_command"
        ]
        assert commands == []  # the new generation's history does not replay the old call
    finally:
        rt.close()


def test_a_cancel_during_parallel_calls_keeps_the_results_that_returned(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server, enable_command_tool=True)
    try:
        server.reply(
            tool_calls=[
                call("c1", "execute_command", {"command": "sleep 30"}),
                call("c2", "read_task_context", {}),
            ]
        )
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        wait_for(lambda: rt.tasks.transcript(task_id)["items"], 10, what="the model turn")
        time.sleep(0.5)  # the read has returned; the command still runs
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=20)
        assert not worker.is_alive()
        assert "stopped" in results[0].detail

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["c1"]
        assert [(c["call_id"], c["status"]) for c in snapshot.received] == [("c2", "succeeded")]
    finally:
        rt.close()


class DeafWriteArgs(ToolArguments):
    order: str = Field(min_length=1)


class DeafWrite(Tool):
    """A write whose client library never looks at `ctx.cancel` (a hung HTTP call)."""

    name = "deaf_write"
    description = "a write that ignores its cancellation"
    effect = "write"
    identity = "intent"
    arguments = DeafWriteArgs

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.started.set()
        self.release.wait(30)
        return ToolResult.ok({"order": args.order})


def test_a_cancel_ends_the_round_when_a_write_ignores_it_and_its_receipt_is_unknown(
    store_url: str, scripts: Path, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the round (its worker slot, the cancel) waited for as long as the tool ran."""
    rt = openai_runtime(store_url, scripts, server)
    tool = DeafWrite()
    rt.executions.receipt_tools.append(tool)
    try:
        server.reply(tool_calls=[call("c1", "deaf_write", {"order": "flush main 4"})])
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        assert tool.started.wait(10)
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=8)  # the 2 s grace, not the tool's 30 s
        assert not worker.is_alive()
        assert "did not stop" in results[0].detail

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["c1"]
        (receipt,) = rt.executions.ledger.list_for_owner(f"task:{task_id}")
        assert receipt.status == "unknown"  # the cancel's end of the generation
        # The tool ends late: the fence refuses what it would record; the receipt stays.
        tool.release.set()
        join_tool_threads("deaf_write")
        assert rt.executions.ledger.get(receipt.invocation_id).status == "unknown"  # type: ignore[union-attr]
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        tool.release.set()
        rt.close()


def test_transcripts_of_finished_tasks_follow_the_retention(store_url: str, scripts: Path) -> None:
    rt, _ = runtime_for(store_url, scripts, retention_days=30)
    try:
        finished, finished_session = claimed(rt)
        live, live_session = claimed(rt)
        for fence, session_id in ((finished, finished_session), (live, live_session)):
            writer = TranscriptWriter(rt.db, fence, session_id, {})
            writer.model_turn(1, {}, ModelTurn(None, (ToolCall("a", "t", {}),)))
            save_round_snapshot(rt.db, writer, "stopped")
        old = utcnow() - timedelta(days=90)
        with rt.db.transaction() as conn:
            conn.execute(update(transcript_entries).values(created_at=old))
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == finished.task_id)
                .values(status="completed", updated_at=old)
            )
        report = run_cleanup(rt.db, rt.settings, batch_size=1)
        assert report.transcript_entries_deleted == 1
        assert rt.tasks.transcript(finished.task_id)["items"] == []
        assert len(rt.tasks.transcript(live.task_id)["items"]) == 1
        with rt.db.transaction(readonly=True) as conn:
            assert snapshot_store.get_snapshot(conn, finished_session) is None
            assert snapshot_store.get_snapshot(conn, live_session) is not None
    finally:
        rt.close()


def test_a_sub_agent_writes_under_its_parent_call_in_the_same_sequence(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        delegate = ToolCall("p1", "delegate", {"question": "q"})
        writer.model_turn(1, {}, ModelTurn(None, (delegate,)))
        sub = writer.child("p1")
        read = ToolCall("s1", "count", {})
        sub.model_turn(1, {}, ModelTurn(None, (read,), usage=TokenUsage(10, 2)))
        sub.tool_results(1, [read], [ToolResult.ok(3)])
        writer.tool_results(1, [delegate], [ToolResult.ok("answer")])
        writer.flush()
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert [e["seq"] for e in entries] == [1, 2, 3, 4]
        assert [e.get("parent_call_id") for e in entries] == [None, "p1", "p1", None]
        assert rt.tasks.explain(fence.task_id)["token_usage"]["total"]["prompt_tokens"] == 10
        assert list(writer.calls) == ["p1"]  # the sub-agent's reads are not the round's calls
        derived = Snapshot.from_transcript(entries[:3], reason="died", generation=1)
        assert [c["call_id"] for c in derived.unknown] == ["p1"]
    finally:
        rt.close()


class LockingRead(Tool):
    """A read that, as it returns, has another transaction hold the task's row for a while:
    the fenced write of its result waits for that transaction."""

    name = "locking_read"
    description = "a read"
    arguments = ToolArguments

    def __init__(self, rt: Runtime, task_id: str) -> None:
        self.rt = rt
        self.task_id = task_id

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        locked = threading.Event()

        def hold() -> None:
            with self.rt.db.transaction() as conn:
                conn.execute(
                    select(tasks.c.task_id).where(tasks.c.task_id == self.task_id).with_for_update()
                )
                locked.set()
                time.sleep(1.0)

        threading.Thread(target=hold, daemon=True).start()
        assert locked.wait(10)
        return ToolResult.ok("read")


def test_a_sub_agent_s_last_results_are_written_before_its_answer_returns(
    pg_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(pg_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        turn = _ScriptTurn.model_validate(
            {"tool_calls": [{"id": "s1", "name": "locking_read", "arguments": {}}]}
        )
        delegations = RoundDelegations(
            session_id,
            SubAgentRun(
                model=lambda: ScriptedModel([turn]),
                host=ToolHost([LockingRead(rt, fence.task_id)], ledger=None),
                max_turns=1,  # the sub-agent ends by its turn budget, right after its results
                stop=threading.Event(),
            ),
        )
        ctx = ToolContext(
            owner=f"task:{fence.task_id}",
            session_id=session_id,
            round_id="intent:1",
            task_id=fence.task_id,
            generation=1,
            fence=fence,
            extras={TRANSCRIPT: writer, CALL_ID: "p1"},
        )
        answer = delegations.delegate(ctx, "what does the read say?")
        assert answer.payload["ended"] == "turn_budget"
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert [(e["kind"], e.get("call_id")) for e in entries] == [
            ("model_turn", None),
            ("tool_result", "s1"),
        ]
        assert {e.get("parent_call_id") for e in entries} == {"p1"}
    finally:
        rt.close()


def test_a_sub_agents_openai_model_uses_the_runtimes_own_settings(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    # It was loaded from the process environment's settings (another server, or none).
    rt = openai_runtime(store_url, scripts, server)
    try:
        model = rt.executions._subagent_model("water")
        assert isinstance(model, OpenAIModel)
        assert str(model.client.base_url).rstrip("/") == server.base_url.rstrip("/")
    finally:
        rt.close()


def test_a_write_past_its_time_limit_is_unknown_and_the_round_goes_on_not_cancelled(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Before, a write that never returned held the round `running` for ever (the heartbeat
    kept the lease alive); now it is given up at ORCH_TOOL_TIMEOUT_SECONDS, not cancelled."""
    rt = openai_runtime(
        store_url, scripts, server, tool_timeout_seconds=1, gateway_timeout_seconds=0.5
    )
    tool = DeafWrite()
    rt.executions.receipt_tools.append(tool)
    try:
        server.reply(tool_calls=[call("c1", "deaf_write", {"order": "flush main 4"})])
        server.reply(tool_calls=[as_call(report_call("c2", "failed"))])
        server.reply(content="done")
        task_id = trigger(rt)
        started = time.monotonic()
        result = rt.executions.run(task_id, 1, worker="w1")
        assert time.monotonic() - started < 8
        assert "cancel" not in result.detail
        assert "stopped" not in result.detail
        assert result.outcome == "failed", result.detail  # the model's report, read after it

        # What the model saw: unknown, verify before any retry, the setting named.
        shown = json.loads(server.bodies[1]["messages"][-1]["content"])
        assert (shown["status"], shown["code"]) == ("unknown", "tool_timeout")
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in shown["message"]
        assert "read-only" in shown["message"]
        entries = rt.tasks.transcript(task_id)["items"]
        (answer,) = [e for e in entries if e["kind"] == "tool_result" and e["call_id"] == "c1"]
        assert (answer["status"], answer["body"]["code"]) == ("unknown", "tool_timeout")
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in render_transcript(rt.tasks.transcript(task_id))

        # The operator's view: the task is not cancelled; the receipt says why it is unknown.
        view = rt.tasks.explain(task_id)
        assert view["status"] == "failed"
        assert view["executions"][0]["outcome"] == "failed"
        (receipt,) = rt.executions.ledger.list_for_owner(f"task:{task_id}")
        assert receipt.status == "unknown"
        shown_text = render_explain(view)
        assert "host's time limit" in shown_text
        assert "ancel" not in shown_text
        # The tool ends late: nothing it says changes the receipt.
        tool.release.set()
        join_tool_threads("deaf_write")
        late = rt.executions.ledger.get(receipt.invocation_id)
        assert late is not None
        assert (late.status, late.summary) == ("unknown", receipt.summary)
    finally:
        tool.release.set()
        rt.close()


def test_a_cancel_while_the_model_thinks_says_the_task_was_cancelled(
    store_url: str, scripts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the round's stop read "the lease may have run out" after an operator's cancel."""
    with OpenAIServer(delay_s=5) as slow:
        rt = openai_runtime(store_url, scripts, slow)
        try:
            slow.reply(content="done")
            task_id = trigger(rt)
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
            )
            worker.start()
            slow.wait_for_requests(1)
            rt.tasks.cancel(task_id, "operator stop")
            worker.join(timeout=8)
            assert not worker.is_alive()
            assert "the task was cancelled: operator stop" in results[0].detail
            lines = [r.getMessage() for r in caplog.records]
            assert not [line for line in lines if "may have run out" in line]
            assert [line for line in lines if "the task was cancelled: operator stop" in line]
        finally:
            rt.close()


class SecretArgs(ToolArguments):
    password: str


class SecretRead(Tool):
    name = "secret_read"
    description = "reads a setting whose value is a secret"
    effect = "sensitive_read"
    arguments = SecretArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok("***")


def test_unreadable_arguments_show_what_the_model_sent_bounded_and_redacted(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Before, a call whose arguments were not JSON showed as `{}` in the transcript."""
    rt = openai_runtime(store_url, scripts, server)
    rt.executions.receipt_tools.append(SecretRead())
    try:
        long_text = '{"note": "\x00' + "x" * 900  # NUL: Postgres refuses it in JSON
        server.reply(
            tool_calls=[
                call("c1", "read_task_context", '{"note": "turbid north'),
                call("c2", "secret_read", '{"password": "hunter2'),
                call("c3", "read_task_context", long_text),
            ]
        )
        server.reply(content="done")
        task_id = trigger(rt)
        rt.executions.run(task_id, 1, worker="w1")
        view = rt.tasks.transcript(task_id)
        (turn,) = [e for e in view["items"] if e["kind"] == "model_turn"][:1]
        shown = {c["id"]: c for c in turn["body"]["tool_calls"]}
        assert shown["c1"]["raw_arguments"] == '{"note": "turbid north'
        assert shown["c1"]["arguments"] == {}
        assert shown["c2"]["raw_arguments"] == REDACTED  # a sensitive tool's text stays hidden
        assert len(shown["c3"]["raw_arguments"]) == 500
        assert shown["c3"]["raw_arguments"].startswith('{"note": "\ufffd')
        page = render_transcript(view)
        assert 'read_task_context raw {"note": "turbid north' in page
        assert "not valid JSON" in page
        assert "hunter2" not in page
        assert "hunter2" not in json.dumps(view)
    finally:
        rt.close()


def test_the_snapshot_waits_a_bounded_time_for_the_rounds_last_results(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000: 聊天快照保存采用有界等待. A background transcript write that never returns (a
    store that hangs) does not hold the round's way out: the snapshot is saved from memory."""
    from concurrent.futures import Future

    from orchestrator.services import recovery

    monkeypatch.setattr(recovery, "SNAPSHOT_WAIT_SECONDS", 0.2)
    rt, _ = runtime_for(store_url, scripts)
    hung: Future[None] = Future()
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        calls = (ToolCall("a", "count", {}), ToolCall("b", "write_it", {"x": 1}))
        writer.model_turn(1, {}, ModelTurn(None, calls))
        writer.calls["a"] = writer.calls["a"].answered("succeeded", None)
        writer._pending = hung  # its last results' write never comes back
        saved: list[Snapshot | None] = []
        way_out = threading.Thread(
            target=lambda: saved.append(save_round_snapshot(rt.db, writer, "stopped")),
            daemon=True,
        )
        way_out.start()
        way_out.join(timeout=5)
        assert not way_out.is_alive(), "the snapshot waited without a bound"
        (snapshot,) = saved
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["b"]
        with rt.db.transaction(readonly=True) as conn:
            stored = snapshot_store.get_snapshot(conn, session_id)
        assert stored is not None
        assert [c["call_id"] for c in stored.received] == ["a"]
    finally:
        hung.set_result(None)
        rt.close()


def test_the_snapshot_write_gives_up_on_a_held_lock_within_its_bound(
    pg_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Postgres a row lock held elsewhere bounds the snapshot's write too (SQLite's own
    busy timeout bounds it there); the round goes on, and the next generation rebuilds the
    snapshot from the durable transcript."""
    from orchestrator.services import recovery

    monkeypatch.setattr(recovery, "SNAPSHOT_WAIT_SECONDS", 0.3)
    rt, _ = runtime_for(pg_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        writer.model_turn(1, {}, ModelTurn(None, (ToolCall("a", "count", {}),)))
        first = save_round_snapshot(rt.db, writer, "stopped")
        assert first is not None
        with rt.db.transaction() as holder:
            holder.exec_driver_sql(
                "SELECT 1 FROM recovery_snapshots WHERE session_id = %s FOR UPDATE",
                (session_id,),
            )
            started = time.monotonic()
            saved: list[Snapshot | None] = []
            way_out = threading.Thread(
                target=lambda: saved.append(save_round_snapshot(rt.db, writer, "again")),
                daemon=True,
            )
            way_out.start()
            way_out.join(timeout=5)
            assert not way_out.is_alive(), "the snapshot waited for the lock without a bound"
        assert saved == [None]
        assert time.monotonic() - started < 3
    finally:
        rt.close()
