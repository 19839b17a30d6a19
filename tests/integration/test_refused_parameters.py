"""Servers that refuse a request parameter the client sends, through the real `openai` client
against the loopback server: OpenAI's reasoning models refuse `max_tokens` (and a temperature
other than 1), some gateways `parallel_tool_calls`. Before, each such 400 failed every round
`model_error`; now the parameter is left out (or renamed as the server says) and the call is
made again, and later conversations with that server send the adapted body first."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.agent.model import ModelError
from tests.integration.test_openai_model import CountSamples, model_for, play
from tests.openai_server import Failure, OpenAIServer, Reply, call


def refusing(name: str, message: str) -> Callable[[dict[str, Any]], Reply | Failure]:
    """Answers 400 `message` while a request carries `name`, else one tool call, then done."""

    def answer(body: dict[str, Any]) -> Reply | Failure:
        if name in body:
            return Failure(400, message=message)
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(content="3 samples")
        return Reply(tool_calls=[call("c1", "count_samples", {"site": "north", "hours": 1})])

    return answer


def _model(server: OpenAIServer, **overrides: Any) -> Any:
    # A model name of its own: what a server refused is remembered per server and model.
    return model_for(server, model=f"openai:m-{uuid.uuid4().hex[:8]}", **overrides)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "parallel_tool_calls",
            "Unsupported parameter: 'parallel_tool_calls' is not supported with this model.",
        ),
        ("parallel_tool_calls", "extra inputs are not permitted: parallel_tool_calls"),
        ("temperature", "Unsupported value: 'temperature' does not support 0.2 with this model."),
    ],
)
def test_a_refused_parameter_is_left_out_and_the_round_goes_on(
    server: OpenAIServer, name: str, message: str
) -> None:
    for _ in range(6):
        server.dynamic(refusing(name, message))
    model = _model(server, llm_temperature=0.2)
    tool = CountSamples()
    assert play(model, tool) == "3 samples"
    assert tool.ran == [("north", 1)]
    statuses = [r.answered for r in server.requests]
    assert statuses == [400, 200, 200]  # refused once, then never sent again
    assert all(name not in body for body in server.bodies)
    # The next conversation with this server and model leaves it out from its first call.
    again = model_for(server, model=f"openai:{model.model}", llm_temperature=0.2)
    assert play(again, CountSamples()) == "3 samples"
    assert [r.answered for r in server.requests[3:]] == [200, 200]


def test_max_tokens_becomes_max_completion_tokens_when_the_server_says_so(
    server: OpenAIServer,
) -> None:
    message = (
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead."
    )
    for _ in range(4):
        server.dynamic(refusing("max_tokens", message))
    assert play(_model(server, llm_max_output_tokens=900), CountSamples()) == "3 samples"
    assert [r.answered for r in server.requests] == [400, 200, 200]
    assert [body["max_completion_tokens"] for body in server.bodies] == [900, 900]


def test_another_400_is_still_a_model_error_at_once(server: OpenAIServer) -> None:
    server.fail(400, message="This model's maximum context length is 4096 tokens (max_tokens)")
    with pytest.raises(ModelError, match="HTTP 400: This model's maximum context length"):
        play(_model(server), CountSamples())
    assert len(server.requests) == 1


def test_a_server_refusing_the_adapted_body_too_fails_with_its_reason(
    server: OpenAIServer,
) -> None:
    for _ in range(3):
        server.fail(400, message="Unsupported parameter: 'parallel_tool_calls'; unsupported model")
    with pytest.raises(ModelError, match="unsupported model"):
        play(_model(server), CountSamples())
    assert len(server.requests) == 2  # the parameter is left out once, not again and again


def test_a_value_the_server_refuses_is_a_model_error_not_a_parameter_left_out(
    server: OpenAIServer,
) -> None:
    """OpenAI names the parameter of a value it refuses too (`param: max_tokens`, code
    `invalid_value`): LLM_MAX_OUTPUT_TOKENS past the model's limit must fail the round with the
    server's words, so the operator lowers it; leaving `max_tokens` out instead ran every
    later call without the cap the window is budgeted for, the setting silently ignored."""
    server.fail(
        400,
        message="max_tokens is too large: 20000. This model supports at most 16384 "
        "completion tokens, whereas you provided 20000.",
        param="max_tokens",
        code="invalid_value",
    )
    with pytest.raises(ModelError, match="HTTP 400: max_tokens is too large"):
        play(_model(server, llm_max_output_tokens=20000), CountSamples())
    assert len(server.requests) == 1


def test_an_unsupported_parameter_named_by_param_alone_is_left_out(server: OpenAIServer) -> None:
    """OpenAI's own refusal of a parameter: `param` and `code: unsupported_parameter`."""
    server.fail(
        400, message="Bad request.", param="parallel_tool_calls", code="unsupported_parameter"
    )
    assert play(_model(server), CountSamples()) == "done"
    assert [r.answered for r in server.requests][:2] == [400, 200]
    assert "parallel_tool_calls" not in server.bodies[-1]
