"""Replies in shapes older gateways and self-hosted servers still send, through the real OpenAI
client against the loopback server: a call as the legacy `function_call`, and an event stream
the request did not ask for. Before, the first was read as an answer without calls (every
round "saved no report") and the second as unreadable (retried, then `model_error` saying
nothing of a stream)."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.model import ModelError, TokenUsage
from tests.integration.test_openai_model import (
    KEY,
    CountSamples,
    Recorder,
    model_for,
    play,
    tool_messages,
)
from tests.openai_server import Garbled, OpenAIServer, call


def _legacy(site: str, hours: int) -> dict[str, str]:
    return {"name": "count_samples", "arguments": json.dumps({"site": site, "hours": hours})}


def test_a_legacy_function_call_runs_as_one_tool_call(server: OpenAIServer) -> None:
    tool = CountSamples()
    server.reply(function_call=_legacy("north", 2))
    server.reply(content="4 samples")
    assert play(model_for(server), tool) == "4 samples"
    assert tool.ran == [("north", 2)]
    # Sent back as a tool call under the host's id, answered by one tool message (the strict
    # server refuses any other history).
    assistant = next(m for m in server.bodies[1]["messages"] if m["role"] == "assistant")
    [sent] = assistant["tool_calls"]
    assert sent["function"]["name"] == "count_samples"
    [answer] = tool_messages(server.bodies[1])
    assert answer["status"] == "succeeded"


def test_the_hosts_call_ids_differ_between_rounds_of_one_session(server: OpenAIServer) -> None:
    """A task keeps one session across its generations, and a write's receipt is keyed by the
    session and the call id: a later round's call under the same made-up id (`call_1_1` in
    every round) was refused `invocation_conflict`, or answered from the earlier receipt. A
    server that sends no ids gets the host's, as a legacy call does."""
    ids = []
    for hours in (1, 3):
        recorder = Recorder()
        server.reply(tool_calls=[call("", "count_samples", {"site": "north", "hours": hours})])
        server.reply(content="done")
        play(model_for(server), CountSamples(), recorder)
        [first] = recorder.turns[0].tool_calls
        ids.append(first.id)
    assert ids[0] != ids[1]


def test_a_reply_with_both_shapes_runs_its_tool_calls_once(server: OpenAIServer) -> None:
    """llama-cpp-python's functionary format fills in both fields with the same call."""
    tool = CountSamples()
    server.reply(
        tool_calls=[call("c1", "count_samples", {"site": "east", "hours": 1})],
        function_call=_legacy("east", 1),
    )
    server.reply(content="2 samples")
    assert play(model_for(server), tool) == "2 samples"
    assert tool.ran == [("east", 1)]


def test_an_unasked_stream_is_read_as_the_reply_it_holds(server: OpenAIServer) -> None:
    tool = CountSamples()
    recorder = Recorder()
    server.reply(
        content="counting both",
        reasoning_content="two sites, two calls",
        tool_calls=[
            call("c1", "count_samples", {"site": "north", "hours": 2}),
            call("c2", "count_samples", {"site": "south", "hours": 5}),
        ],
        usage=(321, 12),
        stream=True,
    )
    server.reply(content="14 samples in all", stream=True)
    assert play(model_for(server), tool, recorder) == "14 samples in all"
    assert sorted(tool.ran) == [("north", 2), ("south", 5)]
    first = recorder.turns[0]
    assert [c.id for c in first.tool_calls] == ["c1", "c2"]
    assert first.content == "counting both"
    assert first.reasoning_content == "two sites, two calls"
    assert first.usage == TokenUsage(prompt_tokens=321, completion_tokens=12)
    assert [r.answered for r in server.requests] == [200, 200]  # nothing retried


def test_a_stream_ending_in_an_error_says_the_server_streamed(server: OpenAIServer) -> None:
    stream = (
        'data: {"id": "s", "object": "chat.completion.chunk", "choices": '
        '[{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
        f'data: {{"error": {{"message": "upstream overloaded for key {KEY}"}}}}\n\n'
    )
    for _ in range(2):
        server.script.append(Garbled(body=stream, content_type="text/event-stream"))
    with pytest.raises(ModelError) as caught:
        play(model_for(server, llm_max_retries=1), CountSamples())
    message = str(caught.value)
    assert "answered with an event stream (text/event-stream)" in message
    assert "upstream overloaded for key ***" in message
    assert KEY not in message


def test_a_page_that_is_no_stream_is_unreadable_as_before(server: OpenAIServer) -> None:
    for _ in range(2):
        server.garble()
    with pytest.raises(ModelError, match="not readable as a chat completion"):
        play(model_for(server, llm_max_retries=1), CountSamples())


def test_a_stream_said_to_be_json_is_read_as_a_stream(server: OpenAIServer) -> None:
    """Some gateways stream under `Content-Type: application/json`: the openai client fails
    to parse it as JSON, and it was retried as unreadable."""
    tool = CountSamples()
    chunk = {
        "id": "s",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "nothing to count"}}],
    }
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
    server.script.append(Garbled(body=body, content_type="application/json"))
    assert play(model_for(server), tool) == "nothing to count"
    assert len(server.requests) == 1


@pytest.mark.parametrize("as_object", [False, True], ids=["arguments-as-text", "as-object"])
def test_calls_streamed_whole_under_one_index_stay_apart(
    server: OpenAIServer, as_object: bool
) -> None:
    """Some gateways stream each call whole under `index` 0. Joined by index, the two calls
    became one under the first's id: with arguments as objects it ran the first call's tool
    with the second's arguments (the north call never ran, the south one under c1's id); as
    text, both ran together into JSON nobody could read, and neither ran."""
    tool = CountSamples()
    recorder = Recorder()
    chunks = []
    for call_id, site in (("c1", "north"), ("c2", "south")):
        arguments: object = {"site": site, "hours": 2}
        piece = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {
                "name": "count_samples",
                "arguments": arguments if as_object else json.dumps(arguments),
            },
        }
        delta = {"role": "assistant", "tool_calls": [piece]}
        chunk = {
            "id": "s",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta}],
        }
        chunks.append(f"data: {json.dumps(chunk)}\n\n")
    body = "".join(chunks) + "data: [DONE]\n\n"
    server.script.append(Garbled(body=body, content_type="text/event-stream"))
    server.reply(content="4 samples")
    assert play(model_for(server), tool, recorder) == "4 samples"
    assert [c.id for c in recorder.turns[0].tool_calls] == ["c1", "c2"]
    assert sorted(tool.ran) == [("north", 2), ("south", 2)]


@pytest.mark.parametrize(
    ("last", "said"),
    [
        ("", "it ended before the reply did (no finish_reason)"),
        (
            'data: {"object": "error", "message": "upstream gone", "code": 502}\n\n',
            "which ended in an error: upstream gone",
        ),
    ],
    ids=["cut-off", "vllm-error-object"],
)
def test_a_stream_that_stops_mid_reply_is_not_the_reply(
    server: OpenAIServer, last: str, said: str
) -> None:
    """A stream cut off on the way (no finish_reason, no [DONE]) or ending in an error object
    (older vLLM's `{"object": "error"}`, no `error` key) was put together from what had come:
    the start of a sentence taken for the model's final answer. It is retried as unreadable."""
    chunk = {
        "id": "s",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "The north site shows no"}}],
    }
    body = f"data: {json.dumps(chunk)}\n\n{last}"
    for _ in range(2):
        server.script.append(Garbled(body=body, content_type="text/event-stream"))
    with pytest.raises(ModelError) as caught:
        play(model_for(server, llm_max_retries=1), CountSamples())
    assert said in str(caught.value)
