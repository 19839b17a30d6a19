"""A configured secret stays out of what is kept and what a tool shows the model.

The review's gaps, each reproduced through a real round (the `openai` client, the loopback
server) and read back from the store:
- a secret the model writes as a dict KEY (a query's parameters, a proposal's payload, an
  unknown tool's arguments) was stored as written: `hide_configured` masked values only;
- the text of unreadable arguments (`raw_arguments`) kept a secret's first 4 characters: it was
  masked by the logs' rule (`sk-n***`);
- a tool's RESULT (a command that prints `.env`) reached the model's context as it was, and a
  long output's preview and pages could show part of a secret cut at their edges.
A read tool's argument VALUES (the fourth reported gap) were already masked in the transcript;
the first test keeps that so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.agent.host import RESULT_MASKED_NOTE, ToolHost
from orchestrator.agent.reply_parts import MAX_RAW_ARGUMENT_CHARS
from orchestrator.services.tasks import Trigger
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from orchestrator.tools.command import ExecuteCommand
from orchestrator.tools.command_output import MASKED_OUTPUT, PREVIEW, READ_LIMIT
from orchestrator.tools.results import PREVIEW_CHARS, ReadToolResult, ResultCache
from tests.executions_support import node, plan_call
from tests.integration.receipt_rows import chat_session
from tests.openai_server import OpenAIServer, call
from tests.transcript_support import as_call, openai_runtime, trigger

#: The runtime's LLM_API_KEY (`openai_runtime`).
API_KEY = "sk-never-shown"


def _tool_messages(server: OpenAIServer) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in server.bodies[-1]["messages"] if m["role"] == "tool"]


def test_a_secret_written_as_a_key_is_kept_as_stars(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    plan = plan_call("p1", "r1", [node("check", "pending")])
    propose = {
        "id": "p2",
        "name": "propose_action",
        "arguments": {
            "node_id": "check",
            "kind": "work_order",
            "payload": {API_KEY: "prod", "crew": "north"},
        },
    }
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            tool_calls=[
                # A read whose value holds the key (masked before too), and one whose key does.
                call(
                    "q1",
                    "query_data_source",
                    {
                        "source": "scada_sim",
                        "parameters": {"point": "DM-RN-01", "measure": f"turbidity {API_KEY}"},
                    },
                ),
                call(
                    "q2",
                    "query_data_source",
                    {"source": "scada_sim", "parameters": {API_KEY: "turbidity"}},
                ),
                call("u1", "login_scada", {API_KEY: {"user": "ops"}}),
                as_call(plan),
            ]
        )
        server.reply(tool_calls=[as_call(propose)])
        server.reply(content="waiting for approval")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
        (action,) = rt.tasks.explain(task_id)["pending_actions"]
        payload = rt.actions.get(action["action_id"]).payload
    finally:
        rt.close()
    assert API_KEY not in json.dumps([entries, payload], default=str)
    calls = {
        c["id"]: c["arguments"]
        for e in entries
        if e["kind"] == "model_turn"
        for c in e["body"]["tool_calls"]
    }
    assert calls["q1"]["parameters"]["measure"] == "turbidity ***"
    assert calls["q2"]["parameters"] == {"***": "turbidity"}
    assert calls["u1"] == {"***": {"user": "ops"}}
    assert calls["p2"]["payload"] == {"***": "prod", "crew": "north"}
    # What the business backend will be sent, once approved.
    assert payload == {"***": "prod", "crew": "north"}


#: Unreadable arguments whose first 500 characters (`MAX_RAW_ARGUMENT_CHARS`) end 6 characters
#: into what follows.
CUT = '{"note": "' + "x" * (MAX_RAW_ARGUMENT_CHARS - len('{"note": "') - 6)


def test_unreadable_arguments_keep_no_part_of_a_secret(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            tool_calls=[
                call("c1", "query_data_source", '{"source": "scada_sim", "note": "' + API_KEY),
                call("c2", "login_scada", '{"token": "' + API_KEY + '", "user": "ops"'),
                # Kept to its first 500 characters, cut inside the key: its first 6 were kept.
                call("c3", "query_data_source", CUT + API_KEY + '", }'),
            ]
        )
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    stored = json.dumps(entries)
    assert API_KEY[:4] + "***" not in stored
    assert API_KEY not in stored
    raw = [
        c["raw_arguments"]
        for e in entries
        if e["kind"] == "model_turn"
        for c in e["body"]["tool_calls"]
    ]
    assert raw == [
        '{"source": "scada_sim", "note": "***',
        '{"token": "***", "user": "ops"',
        CUT + "***",
    ]


def test_a_command_that_prints_a_secret_shows_the_model_stars(
    store_url: str, scripts: Path, server: OpenAIServer, tmp_path: Path
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(f"LLM_API_KEY={API_KEY}\nREGION=north\n")
    rt = openai_runtime(store_url, scripts, server, enable_command_tool=True)
    try:
        server.reply(tool_calls=[call("c1", "execute_command", {"command": f"cat {env_file}"})])
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
        evidence = rt.tasks.explain(task_id)
    finally:
        rt.close()
    (shown,) = _tool_messages(server)
    assert shown["status"] == "succeeded"
    assert shown["result"]["output"] == "LLM_API_KEY=***\nREGION=north\n"
    assert shown["result"]["secrets_masked"] == MASKED_OUTPUT  # the model is told why
    assert API_KEY not in json.dumps([server.bodies, entries, evidence], default=str)


def test_a_long_outputs_preview_and_pages_cut_no_secret_in_part(sqlite_url: str) -> None:
    """The preview keeps the output's two ends and a page ends at READ_LIMIT characters: a key
    across either edge was shown in part (`sk-nev` ... `er-shown`), which no masking of the
    page can find. Offsets count the masked output."""
    db = Database.from_url(sqlite_url)
    tool = ExecuteCommand(secrets=[API_KEY])
    # The host's own preview is out of the way: the tool's are looked at here.
    host = ToolHost([tool], ledger=ReceiptLedger(db), secrets=[API_KEY], preview_chars=10**6)
    try:
        ctx = ToolContext("alice", chat_session(db), "r1")
        head = PREVIEW // 2 - 6  # the key starts 6 characters before the preview's first cut
        page = READ_LIMIT - 6 - head - len(API_KEY)  # and again 6 before the first page's end
        # The key printed in two halves: the command line itself holds no secret to mask.
        key = f"printf '%s%s' '{API_KEY[:7]}' '{API_KEY[7:]}'"
        script = f"printf 'a%.0s' $(seq {head}); {key}; " + (
            f"printf 'b%.0s' $(seq {page}); {key}; printf 'c%.0s' $(seq 5000)"
        )
        (ran,) = host.run_turn(ctx, [ToolCall("r1", "execute_command", {"command": script})])
        assert ran.status == "succeeded"
        assert ran.payload["output_file"] is not None
        pages, offset = [], 0
        while offset is not None:
            (read,) = host.run_turn(
                ctx,
                [
                    ToolCall(
                        f"p{offset}",
                        "execute_command",
                        {
                            "action": "read",
                            "process_id": ran.payload["process_id"],
                            "offset": offset,
                        },
                    )
                ],
            )
            pages.append(read.payload["content"])
            offset = read.payload["next_offset"]
    finally:
        tool.reap_all()
        db.dispose()
    for part in (API_KEY[:6], API_KEY[-6:]):
        assert part not in ran.payload["output"]
        assert all(part not in text for text in pages)
    whole = "".join(pages)
    assert whole == "a" * head + "***" + "b" * page + "***" + "c" * 5000


class _Args(ToolArguments):
    pass


class _Echo(Tool):
    """A read whose answer holds the key (a backend's error, a config file it serves)."""

    name = "read_config"
    description = "The district's configuration."
    arguments = _Args

    def __init__(self, payload: Any, message: str | None = None) -> None:
        self.payload = payload
        self.message = message

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok(self.payload, self.message)


def test_every_result_is_masked_before_it_is_paged() -> None:
    """The host keeps a large result whole for `read_tool_result`: masked only in the preview,
    the key came back in a page; masked before paging, no page holds it, and the offsets count
    the masked text. A key in a key, in a message, and a result with none (left as it was)."""
    ctx = ToolContext(owner="task:t1", session_id="s1", round_id="intent:1")
    cache = ResultCache()
    text = "x" * (PREVIEW_CHARS - 4) + API_KEY + "y" * 10_000
    big, keyed = _Echo(text), _Echo({API_KEY: "prod"}, message=f"read with {API_KEY}")
    keyed.name = "read_keyed"
    plain = _Echo({"rows": [1, 2]})
    plain.name = "read_plain"
    host = ToolHost(
        [big, keyed, plain, ReadToolResult(cache)], ledger=None, results=cache, secrets=[API_KEY]
    )
    first, second, third = host.run_turn(
        ctx,
        [
            ToolCall("c1", "read_config", {}),
            ToolCall("c2", "read_keyed", {}),
            ToolCall("c3", "read_plain", {}),
        ],
    )
    preview = first.payload
    masked = "x" * (PREVIEW_CHARS - 4) + "***" + "y" * 10_000
    assert preview["preview"] == masked[:PREVIEW_CHARS]  # not the key's first 4 characters
    (page,) = host.run_turn(
        ctx,
        [
            ToolCall(
                "p1",
                "read_tool_result",
                {"result_id": preview["result_id"], "offset": preview["next_offset"]},
            )
        ],
    )
    whole = preview["preview"] + page.payload["content"]
    assert whole == masked
    assert RESULT_MASKED_NOTE in (first.message or "")
    assert second.payload == {"***": "prod"}
    assert second.message == f"read with ***. Note: {RESULT_MASKED_NOTE}"
    assert third.payload is plain.payload
    assert third.message is None


def test_a_key_in_the_tasks_context_reaches_the_model_as_stars(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """The business backend's context is data the model reads in the brief of every request
    and in `read_task_context`'s answer: a configured secret in it (a backend that copied the
    deployment's key into a task) was shown as it was."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(content="done")
        task_id = rt.tasks.trigger(
            Trigger(task_type="water", title=f"lab {API_KEY}", context={"lab_key": API_KEY})
        ).task.task_id
        assert rt.executions.run(task_id, 1, worker="w1").ran
    finally:
        rt.close()
    assert API_KEY not in json.dumps(server.bodies)
    brief = server.bodies[0]["messages"][1]["content"]
    assert 'Task context: {"lab_key":"***"}' in brief
    (context,) = _tool_messages(server)
    assert RESULT_MASKED_NOTE in context["message"]
