"""What may be secret in a call no schema vouches for stays out of the transcript.

A known tool's schema says which arguments are secret (a command's `env`) or sensitive; a call
of an unknown tool has none, nor do arguments its tool refused (an extra `password`), and they
reached the durable transcript as the model sent them: a model that put a password or the API
key into a mistaken call leaked it to operators, the console and the API. They are now masked
by a conservative rule (`hide_unknown_arguments`), tested here through a real round (the
`openai` client, the loopback server) with the transcript read back from the store.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.agent.host import RESULT_MASKED_NOTE
from orchestrator.agent.sensitive import hide_unknown_arguments
from tests.openai_server import OpenAIServer, call
from tests.transcript_support import openai_runtime, trigger

#: The runtime's LLM_API_KEY (`openai_runtime`).
API_KEY = "sk-never-shown"
MISTAKEN = {
    "user": "ops",
    "password": "hunter2-pw",
    "auth": {"api_key": "abc123xyz"},
    "note": f"the key is {API_KEY}",
    "headers": ["Authorization: Bearer tok.en-value"],
    "retries": 3,
}


def test_an_unknown_tools_secrets_never_reach_the_transcript(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            tool_calls=[
                call("c1", "login_scada", MISTAKEN),
                # Unreadable arguments of an unknown tool: kept as text, masked as a log line.
                call("c2", "login_scada", '{"password": "hunter2-raw", "user": "ops"'),
            ]
        )
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    stored = json.dumps(entries)
    for secret in ("hunter2-pw", "hunter2-raw", "abc123xyz", API_KEY, "tok.en-value"):
        assert secret not in stored
    calls = [c for e in entries if e["kind"] == "model_turn" for c in e["body"]["tool_calls"]]
    first, second = calls
    # The shape and what is not secret stay: an operator sees what the model got wrong.
    assert first["name"] == "login_scada"
    assert first["arguments"]["user"] == "ops"
    assert first["arguments"]["retries"] == 3
    assert first["arguments"]["password"] == "***"
    assert first["arguments"]["auth"] == {"api_key": "***"}  # all below a secret-looking key
    assert first["arguments"]["note"].startswith("the key is ")
    assert first["arguments"]["headers"] == ["Authorization: *** ***"]  # as the logs mask it
    assert '"user": "ops"' in second["raw_arguments"]
    results = [(e["tool_name"], e["status"]) for e in entries if e["kind"] == "tool_result"]
    assert results == [("login_scada", "failed")] * 2
    # The model itself is shown its call as it made it: only what outlives it is masked.
    sent_back = [
        json.loads(c["function"]["arguments"])
        for m in server.bodies[1]["messages"]
        for c in m.get("tool_calls") or ()
    ]
    assert sent_back[0] == MISTAKEN


def test_the_rule_masks_secret_looking_keys_at_any_depth_and_configured_secrets() -> None:
    hidden = hide_unknown_arguments(
        {
            "rows": [{"id": 1, "Session-Token": ["a", "b"]}],
            "query": "SELECT 1",
            "text": "key s3cr3t-value here",
            "ok": True,
        },
        ["s3cr3t-value"],
    )
    assert hidden == {
        "rows": [{"id": 1, "Session-Token": ["***", "***"]}],
        "query": "SELECT 1",
        "text": "key *** here",  # wholly, as in a call its tool accepted
        "ok": True,
    }


def test_arguments_a_tool_refused_keep_their_secrets_out_of_the_transcript(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """An extra `password` makes a data-source query invalid: nothing ran, and its arguments,
    which no schema vouches for, are kept by the same rule as an unknown tool's."""
    refused = {
        "source": "scada_sim",
        "password": "hunter2-pw",
        "parameters": {"point": "DM-RN-01", "measure": f"turbidity {API_KEY}"},
    }
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[call("c1", "query_data_source", refused)])
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    stored = json.dumps(entries)
    assert "hunter2-pw" not in stored
    assert API_KEY not in stored
    (shown,) = [c for e in entries if e["kind"] == "model_turn" for c in e["body"]["tool_calls"]]
    assert shown["arguments"]["source"] == "scada_sim"
    assert shown["arguments"]["password"] == "***"
    assert shown["arguments"]["parameters"]["point"] == "DM-RN-01"
    # The key wholly, as in a call its tool accepted: no first characters kept.
    assert shown["arguments"]["parameters"]["measure"] == "turbidity ***"
    (result,) = [e for e in entries if e["kind"] == "tool_result"]
    assert result["status"] == "failed"
    assert "password" in result["body"]["message"]  # what the model got wrong stays readable


def test_a_result_that_echoes_a_configured_secret_is_masked(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A valid query naming the API key as its source is refused "unknown source 'sk-...'":
    the key was in the transcript twice, in the call and in the tool's answer."""
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(
            tool_calls=[call("c1", "query_data_source", {"source": API_KEY, "parameters": {}})]
        )
        server.reply(content="done")
        task_id = trigger(rt)
        assert rt.executions.run(task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task_id)["items"]
    finally:
        rt.close()
    assert API_KEY not in json.dumps(entries)
    (result,) = [e for e in entries if e["kind"] == "tool_result"]
    assert result["body"]["message"].startswith("unknown source '***'")
    # The model is shown the tool's words masked too, and why (every result is masked before
    # the model or the transcript has it: `agent.host`).
    (shown,) = [m for m in server.bodies[1]["messages"] if m["role"] == "tool"]
    assert API_KEY not in shown["content"]
    assert RESULT_MASKED_NOTE in json.loads(shown["content"])["message"]
