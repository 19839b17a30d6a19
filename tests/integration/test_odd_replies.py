"""Odd but legal replies of a real model, through the real OpenAI client and the loopback
server: what the model is told back must let it correct itself. And answers real servers and
gateways send that are not quite OpenAI's: arguments encoded twice, content as parts, an error
in a 200, a choice without a message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.agent.model import ModelError, TokenUsage
from tests.integration.test_openai_model import (
    CountSamples,
    Recorder,
    model_for,
    play,
    tool_messages,
)
from tests.openai_server import Garbled, OpenAIServer, call


@pytest.mark.parametrize("name", ["Count_Samples", "count-samples", " count_samples() "])
def test_a_misspelt_tool_name_is_refused_naming_the_tool(server: OpenAIServer, name: str) -> None:
    """Before, "unknown tool 'Count_Samples'" only: the model had to guess what was wrong."""
    tool = CountSamples()
    server.reply(tool_calls=[call("c1", name, {"site": "north", "hours": 2})])
    server.reply(tool_calls=[call("c2", "count_samples", {"site": "north", "hours": 2})])
    server.reply(content="4 samples")
    assert play(model_for(server), tool) == "4 samples"
    [refused] = tool_messages(server.bodies[1])
    assert (refused["status"], refused["code"]) == ("failed", "unknown_tool")
    assert "'count_samples'" in refused["message"]
    assert "tool names are exact" in refused["message"]
    assert tool.ran == [("north", 2)]  # only the corrected call ran


def test_arguments_cut_mid_string_say_where_in_plain_words(server: OpenAIServer) -> None:
    tool = CountSamples()
    server.reply(tool_calls=[call("c1", "count_samples", '{"site": "nor')], finish_reason="length")
    server.reply(content="giving up")
    assert play(model_for(server), tool) == "giving up"
    [answer] = tool_messages(server.bodies[1])
    message: Any = answer["message"]
    assert "Unterminated string starting at character 9" in message, json.dumps(message)
    assert " at at " not in message


def test_arguments_nested_past_reading_are_answered_and_the_round_goes_on(
    server: OpenAIServer,
) -> None:
    """A looping model's `[[[[...` (cut at its output limit), nested deeper than JSON can be
    read, or an object deeper than the host reads: before, the first failed the task
    `agent_error` ("maximum recursion depth exceeded") with a traceback in the worker's log."""
    tool = CountSamples()
    looped = '{"site": ' + "[" * 20000
    deep = '{"site": ' + "[" * 150 + "1" + "]" * 150 + "}"
    server.reply(tool_calls=[call("c1", "count_samples", looped)], finish_reason="length")
    server.reply(tool_calls=[call("c2", "count_samples", deep)])
    server.reply(content="giving up")
    assert play(model_for(server), tool) == "giving up"
    [looped_answer] = tool_messages(server.bodies[1])
    assert looped_answer["status"] == "failed"
    assert "nested more than 100 levels deep" in looped_answer["message"]
    deep_answer = tool_messages(server.bodies[2])[-1]
    assert "nested more than 100 levels deep" in deep_answer["message"]
    assert tool.ran == []


def test_an_answer_nested_past_reading_is_retried_as_unreadable(server: OpenAIServer) -> None:
    """A server that sends the arguments as an object (Ollama) nested past what JSON can be
    read: the whole answer cannot be read. Before: `agent_error` with a traceback."""
    nested = "[" * 5000 + "1" + "]" * 5000
    function = {"name": "count_samples", "arguments": "NESTED"}
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": function}],
    }
    completion = _completion(message).body.replace('"NESTED"', nested)
    server.script.append(Garbled(body=completion, content_type="application/json"))
    server.reply(content="2 samples")
    assert play(model_for(server), CountSamples()) == "2 samples"
    assert len(server.requests) == 2


def _completion(message: Any) -> Garbled:
    """A 200 JSON completion whose one choice holds `message` as it is."""
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    return Garbled(body=json.dumps(body), content_type="application/json")


def test_arguments_encoded_twice_by_the_server_run_as_the_object_they_hold(
    server: OpenAIServer,
) -> None:
    """Before: "the arguments must be a JSON object, not a string", on every try: the model
    wrote an object and could not correct what a proxy did to it."""
    tool = CountSamples()
    twice = json.dumps(json.dumps({"site": "north", "hours": 1}))
    server.reply(tool_calls=[call("c1", "count_samples", twice)])
    server.reply(content="2 samples")
    assert play(model_for(server), tool) == "2 samples"
    assert tool.ran == [("north", 1)]
    # A string that is only a string is still refused, naming what it is.
    server.reply(tool_calls=[call("c2", "count_samples", json.dumps("north"))])
    server.reply(content="done")
    play(model_for(server), tool)
    [refused] = tool_messages(server.bodies[-1])
    assert "must be a JSON object, not a string" in refused["message"]


def test_content_sent_as_parts_is_the_reply_s_text_and_thinking(server: OpenAIServer) -> None:
    """Mistral's reasoning models: before, the round's final text was the list of parts."""
    parts = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "north took 2"}]},
        {"type": "text", "text": "2 samples"},
    ]
    server.script.append(_completion({"role": "assistant", "content": parts}))
    recorder = Recorder()
    assert play(model_for(server), CountSamples(), recorder) == "2 samples"
    assert recorder.turns[0].reasoning_content == "north took 2"


def test_an_error_in_a_200_is_named_in_the_reason(server: OpenAIServer) -> None:
    error = {"error": {"message": "upstream model overloaded", "code": 503}}
    for _ in range(2):
        server.script.append(Garbled(body=json.dumps(error), content_type="application/json"))
    with pytest.raises(ModelError, match=r"no choices \(its error: upstream model overloaded\)"):
        play(model_for(server, llm_max_retries=1), CountSamples())


def test_a_choice_without_a_message_is_retried_as_unreadable(server: OpenAIServer) -> None:
    """Before: the round crashed with AttributeError ('NoneType' object has no attribute
    'tool_calls')."""
    server.script.append(_completion(None))
    server.reply(content="2 samples")
    assert play(model_for(server), CountSamples()) == "2 samples"
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("message", "part"),
    [
        ("hello", "its choice has no message object"),
        ({"content": 42}, "its content is a number, neither text nor parts"),
        ({"content": None, "tool_calls": {"id": "a"}}, "its tool_calls is not a list"),
        (
            {"content": None, "tool_calls": [{"id": "a", "function": "count_samples"}]},
            "a tool call, or its function, is not an object",
        ),
        ({"content": None, "function_call": "count_samples"}, "its function_call is not an"),
    ],
)
def test_a_reply_in_a_wrong_shape_is_unreadable_naming_the_part(
    server: OpenAIServer, message: Any, part: str
) -> None:
    """Before: some of these failed the task "agent error: 'str' object has no attribute
    'arguments'" with a traceback; others ran as a final answer of no text."""
    for _ in range(2):
        server.script.append(_completion(message))
    with pytest.raises(ModelError) as caught:
        play(model_for(server, llm_max_retries=1), CountSamples())
    assert f"not readable as a chat completion: {part}" in str(caught.value)


def test_a_numeric_call_id_and_counts_as_text_are_read(server: OpenAIServer) -> None:
    """Before: an id of 1 failed the task "agent error: argument of type 'int' is not
    iterable", a usage of "120" one of int()."""
    one = call("c1", "count_samples", {"site": "n", "hours": 1})
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"content": None, "tool_calls": [{**one, "id": 1}]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": "120", "completion_tokens": "many"},
    }
    server.script.append(Garbled(body=json.dumps(body), content_type="application/json"))
    server.reply(content="2 samples")
    recorder = Recorder()
    assert play(model_for(server), CountSamples(), recorder) == "2 samples"
    first = recorder.turns[0]
    # Read as text; a counter, so scoped to the round and turn (`test_call_ids`).
    [one_id] = [c.id for c in first.tool_calls]
    assert one_id.startswith("1~")
    assert first.usage == TokenUsage(prompt_tokens=120, completion_tokens=0)


def test_a_stream_event_nested_past_reading_is_retried_as_unreadable(
    server: OpenAIServer,
) -> None:
    """The same answer as an event stream the request did not ask for (gateways that always
    stream). Before: `agent_error` with a traceback."""
    nested = "[" * 5000 + "1" + "]" * 5000
    chunk = {
        "id": "s",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "NESTED"}}],
    }
    stream = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".replace('"NESTED"', nested)
    for _ in range(2):
        server.script.append(Garbled(body=stream, content_type="text/event-stream"))
    with pytest.raises(ModelError, match="an event of it is nested too deeply"):
        play(model_for(server, llm_max_retries=1), CountSamples())
