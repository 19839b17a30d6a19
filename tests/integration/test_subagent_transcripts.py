"""A sub-agent's transcript entries: under its parent call, in the round's sequence, written
before its answer returns; and its model's settings."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from orchestrator.agent.host import ToolHost
from orchestrator.agent.model import ModelTurn, ScriptedModel, TokenUsage, _ScriptTurn
from orchestrator.agent.openai_model import OpenAIModel
from orchestrator.agent.request import TRANSCRIPT
from orchestrator.agent.subagents import RoundDelegations, SubAgentRun
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.domain.recovery import Snapshot
from orchestrator.runtime import Runtime
from orchestrator.store.tables import tasks
from orchestrator.tools.base import (
    CALL_ID,
    Tool,
    ToolArguments,
    ToolCall,
    ToolContext,
    ToolResult,
)
from tests.executions_support import (
    runtime_for,
)
from tests.openai_server import OpenAIServer
from tests.transcript_support import claimed, openai_runtime


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


def test_a_sub_agents_empty_answer_is_said_to_be_empty(pg_url: str, scripts: Path) -> None:
    """The parent's model was given `"answer": ""`, which reads as a sub-agent that found
    nothing; now it is told the sub-agent's model returned nothing."""
    rt, _ = runtime_for(pg_url, scripts)
    try:
        fence, session_id = claimed(rt)
        delegations = RoundDelegations(
            session_id,
            SubAgentRun(
                model=lambda: ScriptedModel([_ScriptTurn.model_validate({"content": "  "})]),
                host=ToolHost([LockingRead(rt, fence.task_id)], ledger=None),
                max_turns=3,
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
        )
        answer = delegations.delegate(ctx, "what does the read say?")
        assert answer.payload["ended"] == "final_answer"
        assert answer.payload["answer"] == (
            "(the sub-agent's model returned an empty answer: no text and no tool call)"
        )
    finally:
        rt.close()
