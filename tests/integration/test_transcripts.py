"""The durable transcript and token usage, in-process over a real store.

The execution service runs rounds with the real OpenAI client against the loopback server: what
each model turn and tool result leaves in the transcript, what is redacted, and how long it is
kept. What a stopped round leaves is in test_transcript_stops.py, sub-agents' entries in
test_subagent_transcripts.py.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from sqlalchemy import update

from orchestrator.agent.model import ModelTurn, TokenUsage
from orchestrator.agent.transcript import REDACTED, TranscriptWriter
from orchestrator.cli.task_transcript import render_transcript
from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.services.cleanup import run_cleanup
from orchestrator.services.recovery import save_round_snapshot
from orchestrator.store import executions as execution_store
from orchestrator.store import snapshots as snapshot_store
from orchestrator.store.tables import tasks, transcript_entries
from orchestrator.store.types import utcnow
from orchestrator.tools.base import (
    Tool,
    ToolArguments,
    ToolCall,
    ToolContext,
    ToolResult,
)
from tests.executions_support import (
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.openai_server import OpenAIServer, Reply, call
from tests.transcript_support import as_call, claimed, openai_runtime, trigger


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


def test_a_server_away_past_the_retry_budget_hands_the_round_back_after_a_back_off(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """503 after 503: before, the round ended `model_error` and the task failed for good, so a
    model server restarting for a minute failed every task that was running. It is handed back
    (counted in `handbacks`), to be requeued after a back-off (no Retry-After was given)."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.fail(503)
        server.fail(503)
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert (result.outcome, result.give_back) == (None, True)
        view = rt.tasks.explain(task_id)
        assert view["status"] == "running"
        assert view["failure_code"] is None
        reason = view["executions"][0]["reason"]
        assert reason.startswith("handed back: the model server is unavailable (HTTP 503")
        assert "LLM_MAX_RETRIES=1" in reason
        assert "sk-never-shown" not in json.dumps(view, default=str)
        with rt.db.transaction(readonly=True) as conn:
            first = execution_store.get_execution(conn, task_id, 1)
        assert first is not None
        assert first.lease_expires_at is not None
        assert first.handed_back_at is not None
        left = (first.lease_expires_at - utcnow()).total_seconds()
        assert 20 < left <= 30  # MODEL_AWAY_BACKOFF: not requeued at the next sweep
        assert rt.sweeper.sweep().requeued == []
    finally:
        rt.close()


def test_each_hand_back_in_a_row_doubles_the_back_off_before_the_requeue(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """The back-off reads how many hand-backs came before this one (the task's `handbacks`,
    which the sweep's requeue counts): 30 s after the first, 60 s after the second."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        for _ in range(4):
            server.fail(503)
        task_id = trigger(rt)
        waits = []
        for generation in (1, 2):
            assert rt.executions.run(task_id, generation, worker="w1").give_back
            with rt.db.transaction(readonly=True) as conn:
                ended = execution_store.get_execution(conn, task_id, generation)
            assert ended is not None
            assert ended.lease_expires_at is not None
            waits.append((ended.lease_expires_at - utcnow()).total_seconds())
            later = utcnow() + timedelta(seconds=waits[-1] + 1)
            assert rt.sweeper.sweep(later).requeued == [(task_id, generation, generation + 1)]
        assert 20 < waits[0] <= 30
        assert 50 < waits[1] <= 60
        assert rt.tasks.get(task_id).handbacks == 2
    finally:
        rt.close()


def test_unreadable_answers_past_the_retry_budget_fail_the_round_with_model_error(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A server that answers, but not a chat completion (a proxy's error page), is not away:
    past the retries the round ends `model_error`, the reason on the execution."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.garble()
        server.garble()
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "failed"
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "model_error"
        reason = view["executions"][0]["reason"]
        assert "not readable as a chat completion" in reason
        assert "LLM_MAX_RETRIES=1" in reason
    finally:
        rt.close()


def test_a_model_server_dribbling_its_answers_times_out_and_hands_the_round_back(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Each byte within any read timeout: the round waited the whole answer out (~15 s each),
    the task `running` all along. Now each call ends at LLM_TIMEOUT_SECONDS, and a server
    that keeps timing out is away: the round is handed back for later."""
    rt = openai_runtime(store_url, scripts, server, llm_timeout_seconds=1)
    try:
        server.dribble()
        server.dribble()
        task_id = trigger(rt)
        started = time.monotonic()
        result = rt.executions.run(task_id, 1, worker="w1")
        assert time.monotonic() - started < 6
        assert result.give_back
        view = rt.tasks.explain(task_id)
        reason = view["executions"][0]["reason"]
        assert reason.startswith("handed back: the model server is unavailable")
        assert "the model server timed out: no answer within LLM_TIMEOUT_SECONDS=1s" in reason
        assert "LLM_MAX_RETRIES=1" in reason
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


class PasswordArgs(ToolArguments):
    password: str


class SecretRead(Tool):
    name = "secret_read"
    description = "reads a setting whose value is a secret"
    effect = "sensitive_read"
    arguments = PasswordArgs

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


def test_a_command_s_environment_is_kept_as_names_only(store_url: str, scripts: Path) -> None:
    """A command's `env` often carries a credential: the command gets it, but the transcript
    and the recovery snapshot keep only the variables' names, and its record says what ran."""
    secret = "s3cr3t-7f1c"
    command = {
        "id": "c1",
        "name": "execute_command",
        "arguments": {
            "command": 'printf %s "$TANK_TOKEN" | sha256sum',
            "env": {"TANK_TOKEN": secret},
        },
    }
    write_script(scripts, "with_env", [{"tool_calls": [command]}, {"content": "ran"}])
    rt, _ = runtime_for(store_url, scripts, enable_command_tool=True)
    try:
        task_id = trigger(rt, "with_env")
        rt.executions.run(task_id, 1, worker="w1")
        entries = rt.tasks.transcript(task_id)["items"]
        fence, session_id = claimed(rt)
        tools = {tool.name: tool for tool in rt.executions._tools(None)}
        writer = TranscriptWriter(rt.db, fence, session_id, tools)
        call_ = ToolCall("c2", "execute_command", command["arguments"])
        writer.model_turn(1, {}, ModelTurn(None, (call_,), usage=TokenUsage(5, 1)))
        snapshot = writer.snapshot("cancelled", None)
    finally:
        rt.close()
    assert secret not in json.dumps(entries)
    [turn] = [e for e in entries if e["kind"] == "model_turn" and e["body"]["tool_calls"]]
    assert turn["body"]["tool_calls"][0]["arguments"]["env"] == {"TANK_TOKEN": REDACTED}
    [result] = [e for e in entries if e["kind"] == "tool_result"]
    assert result["status"] == "succeeded"
    # The command had the real value.
    assert hashlib.sha256(secret.encode()).hexdigest() in json.dumps(result["body"])
    [unknown] = snapshot.unknown
    assert unknown["arguments"]["env"] == {"TANK_TOKEN": REDACTED}
