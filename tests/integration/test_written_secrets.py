"""A configured secret the model copies into what it writes is not stored or served.

The transcript masked the model's API key wherever it appeared, but the report, the plan, the
proposal and a business write kept the arguments as the model wrote them, and the API, the
console and the webhooks to the business backend served the key. The host masks configured
secrets in every write's arguments before the tool sees them (`agent.host`) and says so in the
result; tested through a real round (the `openai` client, the loopback server), read back
through the task's view, the action and the outbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from orchestrator.agent.compaction import Compaction
from orchestrator.agent.host import MASKED_NOTE, ToolHost
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.store import outbox_views
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from tests.executions_support import fenced_ctx, node, plan_call
from tests.openai_server import OpenAIServer
from tests.transcript_support import as_call, claimed, openai_runtime, trigger

#: The runtime's LLM_API_KEY (`openai_runtime`).
API_KEY = "sk-never-shown"


def test_a_key_the_model_writes_is_stored_and_served_as_stars(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    check = {**node("check", "pending"), "description": f"call the lab with {API_KEY}"}
    sample = {
        **node("sample", "waiting", actor="human"),
        "description": f"crew: log in with key {API_KEY}",
        "reason": "a crew must sample",
    }
    plan = plan_call("c1", "r1", [check, sample])
    plan["arguments"]["reason"] = f"first plan ({API_KEY})"
    propose = {
        "id": "c2",
        "name": "propose_action",
        "arguments": {
            "node_id": "check",
            "kind": "work_order",
            "payload": {"crew": "north", "note": f"token {API_KEY}"},
        },
    }
    report = {
        "id": "c3",
        "name": "save_report",
        "arguments": {
            "summary": f"waits for the crew; the key is {API_KEY}",
            "findings": [f"the lab answered to {API_KEY}", "turbid"],
            "outcome": "waiting",
        },
    }
    rt = openai_runtime(store_url, scripts, server)
    try:
        for turn in (plan, propose, report):
            server.reply(tool_calls=[as_call(turn)])
        server.reply(content="waiting for the crew")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        view = rt.tasks.explain(task_id)
        (action,) = view["pending_actions"]
        payload = rt.actions.get(action["action_id"]).payload
        with rt.db.transaction(readonly=True) as conn:
            outbox = [row.body for row in outbox_views.list_rows(conn, task_id=task_id)]
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    assert view["status"] == "waiting"
    served = json.dumps([view, payload, outbox], default=str)
    assert API_KEY not in served
    assert view["report"]["summary"] == "waits for the crew; the key is ***"
    assert view["report"]["findings"] == ["the lab answered to ***", "turbid"]
    nodes = {n["id"]: n for n in view["plan"]["nodes"]}
    assert nodes["check"]["description"] == "call the lab with ***"
    assert nodes["sample"]["description"] == "crew: log in with key ***"
    assert payload == {"crew": "north", "note": "token ***"}
    # The model is told, in each write's result, why it will read *** back.
    shown = [json.loads(m["content"]) for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
    assert [r["status"] for r in shown] == ["succeeded", "pending", "succeeded"]
    assert all(MASKED_NOTE in r["message"] for r in shown)
    assert all(API_KEY not in r["message"] for r in shown)
    results = [e for e in entries if e["kind"] == "tool_result"]
    assert all(MASKED_NOTE in e["body"]["message"] for e in results)


def test_the_models_own_text_keeps_a_key_out_of_the_transcript(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """The model's answer and thinking were written as sent: a key it read (or guessed) was in
    the transcript, which the API and the console serve."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            content=f"the lab's key is {API_KEY}", reasoning_content=f"I saw {API_KEY} earlier"
        )
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
        # A compaction's summary is the model's text too.
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {}, secrets=[API_KEY])
        writer.compacted(Compaction(f"so far: the key {API_KEY}", "model", 4, 900, 100))
        summaries = rt.tasks.transcript(fence.task_id)["items"]
    finally:
        rt.close()
    assert API_KEY not in json.dumps([entries, summaries])
    (turn,) = [e["body"] for e in entries if e["kind"] == "model_turn"]
    assert turn["content"] == "the lab's key is ***"
    assert turn["reasoning_content"] == "I saw *** earlier"
    (summary,) = [e["body"] for e in summaries if e["kind"] == "summary"]
    assert summary["summary"] == "so far: the key ***"


def test_a_write_without_a_secret_is_run_and_answered_as_before(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[as_call(plan_call("c1", "r1", [node("check", "pending")]))])
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
    finally:
        rt.close()
    (shown,) = [m for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
    assert MASKED_NOTE not in shown["content"]


class _OrderArgs(ToolArguments):
    crew: str = Field(min_length=1)
    note: str = ""


class _WorkOrder(Tool):
    """A business write (a receipt first) that keeps what it was sent, as a backend would."""

    name = "create_work_order"
    description = "create a work order"
    effect = "write"
    identity = "intent"
    arguments = _OrderArgs

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.sent.append(args.model_dump())
        return ToolResult.ok({"order": len(self.sent)})


def test_a_business_writes_fields_reach_the_backend_masked(
    store_url: str, scripts: Path, server: OpenAIServer, db: Database
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        fence, session_id = claimed(rt)
    finally:
        rt.close()
    tool = _WorkOrder()
    host = ToolHost([tool], ledger=ReceiptLedger(db), secrets=[API_KEY])
    order = {"crew": "north", "note": f"use {API_KEY} at the gate"}
    ctx = fenced_ctx(fence, session_id)
    (first,) = host.run_turn(ctx, [ToolCall("w1", "create_work_order", order)])
    # The same write again (the model retrying it) is one write: one receipt, one order.
    (again,) = host.run_turn(ctx, [ToolCall("w2", "create_work_order", order)])
    assert tool.sent == [{"crew": "north", "note": "use *** at the gate"}]
    assert (first.status, again.status) == ("succeeded", "succeeded")
    assert first.invocation_id == again.invocation_id
    assert first.message is not None
    assert MASKED_NOTE in first.message
    # A secret in no argument: the call runs as sent, and no note.
    (plain,) = host.run_turn(ctx, [ToolCall("w3", "create_work_order", {"crew": "south"})])
    assert tool.sent[-1] == {"crew": "south", "note": ""}
    assert MASKED_NOTE not in (plain.message or "")
