"""Odd but legal replies of a real model, through the real OpenAI client and the loopback
server: what the model is told back must let it correct itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_openai_model import CountSamples, model_for, play, tool_messages
from tests.openai_server import OpenAIServer, call


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
