"""A model call bounded in time and size, with the real `openai` client against the loopback
server misbehaving on the wire: an answer dribbled a byte at a time, one far past the cap (sent
chunked, with its Content-Length, or as a gzip bomb), and a normal one gzipped."""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any

import pytest

from orchestrator.agent.model import ModelError, TokenUsage
from orchestrator.agent.model_http import MAX_MODEL_ANSWER_BYTES
from orchestrator.agent.openai_model import OpenAIModel
from tests.integration.test_openai_model import KEY
from tests.integration.test_openai_model import model_for as shared_model_for
from tests.openai_server import OpenAIServer, call

MESSAGES = [{"role": "user", "content": "count the samples"}]
CAP = MAX_MODEL_ANSWER_BYTES
TOO_LARGE = r"larger than 16 MiB \(the cap on a model answer\)"


def model_for(server: OpenAIServer, **overrides: Any) -> OpenAIModel:
    """The model of `test_openai_model`, with one retry: each bound is met twice, then given up."""
    return shared_model_for(server, **{"llm_max_retries": 1, **overrides})


def calls_counted(status: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"model": "test-model", "status": status}
    return REGISTRY.get_sample_value("orchestrator_model_calls_total", labels) or 0.0


def test_a_dribbled_answer_ends_at_the_timeout_is_retried_then_a_model_error(
    server: OpenAIServer,
) -> None:
    """Each byte comes well within any read timeout; before, the call (and the round, and the
    task, `running`) waited the whole ~15 s the answer took, however small the timeout."""
    server.dribble()
    server.dribble()
    timeouts = calls_counted("unreachable")  # where timeouts were counted before, too
    model = model_for(server, llm_timeout_seconds=1)
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model.next_turn(MESSAGES, [], threading.Event())
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert (
        "(the model server timed out: no answer within LLM_TIMEOUT_SECONDS=1s); "
        "gave up after 1 retries" in message
    )
    assert KEY not in message
    assert 2.0 <= elapsed < 3.5  # two calls of 1 s and the back-off between them
    assert len(server.requests) == 2
    assert calls_counted("unreachable") == timeouts + 2
    # The abandoned request gave its connection up: the server's next byte found it closed.
    assert server.dropped.wait(5)


def test_a_dribbled_answer_is_retried_and_the_next_one_is_taken(server: OpenAIServer) -> None:
    server.dribble()
    server.reply(content="4 samples")
    started = time.monotonic()
    turn = model_for(server, llm_timeout_seconds=1).next_turn(MESSAGES, [], threading.Event())
    assert turn.content == "4 samples"
    assert time.monotonic() - started < 2.5
    assert server.dropped.wait(5)


def test_an_error_status_with_a_dribbled_body_is_a_timeout_too(server: OpenAIServer) -> None:
    """The openai client reads an error's body itself, outside its own timeout handling."""
    server.dribble(status=503)
    server.dribble(status=503)
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"timed out: no answer within LLM_TIMEOUT_SECONDS=1s\)"):
        model_for(server, llm_timeout_seconds=1).next_turn(MESSAGES, [], threading.Event())
    assert time.monotonic() - started < 3.5
    assert server.dropped.wait(5)


def test_an_answer_past_the_cap_is_refused_with_at_most_the_cap_in_memory(
    server: OpenAIServer,
) -> None:
    """40 MiB sent chunked (no length to refuse it by): before, it was read whole (twice that
    at the peak) and, being a valid completion padded with whitespace, taken."""
    server.oversize(40 * 1024 * 1024)
    server.oversize(40 * 1024 * 1024)
    unreadable = calls_counted("unreadable")
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match=TOO_LARGE) as caught:
            model_for(server).next_turn(MESSAGES, [], threading.Event())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "gave up after 1 retries" in str(caught.value)
    assert peak < CAP * 3 // 2
    assert calls_counted("unreadable") == unreadable + 2
    assert server.dropped.wait(5)


def test_a_declared_length_past_the_cap_is_refused_unread_and_retried(
    server: OpenAIServer,
) -> None:
    server.oversize(40 * 1024 * 1024, declared=True)
    server.reply(content="4 samples")
    unreadable = calls_counted("unreadable")
    tracemalloc.start()
    try:
        turn = model_for(server).next_turn(MESSAGES, [], threading.Event())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert turn.content == "4 samples"
    assert len(server.requests) == 2
    assert peak < 4 * 1024 * 1024  # nothing of the body was read
    # Counted as an answer past the cap, not as an unreachable server.
    assert calls_counted("unreadable") == unreadable + 1


def test_a_gzip_bomb_is_refused_without_expanding_it(server: OpenAIServer) -> None:
    """64 MiB once expanded, about 64 KiB on the wire: before, httpx expanded it whole."""
    server.oversize(64 * 1024 * 1024, gzip=True)
    server.oversize(64 * 1024 * 1024, gzip=True)
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match=TOO_LARGE):
            model_for(server).next_turn(MESSAGES, [], threading.Event())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CAP * 3 // 2


def test_a_gzipped_answer_reads_as_a_plain_one(server: OpenAIServer) -> None:
    """gzip is undone by the bound, not by httpx: the same completion, calls, usage and all."""
    tool_calls = [call("c1", "count_samples", {"site": "north", "hours": 2})]
    for gzip in (True, False):
        server.reply(
            content="counting",
            tool_calls=tool_calls,
            reasoning_content="north first",
            usage=(120, 8),
            gzip=gzip,
        )
    # A conversation each: in one, the same call id in a second turn would be scoped to it.
    zipped, plain = (model_for(server).next_turn(MESSAGES, [], threading.Event()) for _ in "zp")
    assert zipped == plain
    assert zipped.content == "counting"
    assert zipped.reasoning_content == "north first"
    assert zipped.usage == TokenUsage(120, 8)
    assert [(c.name, c.arguments) for c in zipped.tool_calls] == [
        ("count_samples", {"site": "north", "hours": 2})
    ]


def test_a_corrupt_gzip_answer_is_unreadable_not_an_unreachable_server(
    server: OpenAIServer,
) -> None:
    """A body that says gzip and is not: the server answered, so it is counted and said as an
    answer that cannot be read (retried as one), not as a server that cannot be reached."""
    server.garble("\x1f\x8b\x09" + "not gzip at all", "application/json", encoding="gzip")
    server.reply(content="4 samples")
    unreadable, unreachable = calls_counted("unreadable"), calls_counted("unreachable")
    turn = model_for(server).next_turn(MESSAGES, [], threading.Event())
    assert turn.content == "4 samples"
    assert calls_counted("unreadable") == unreadable + 1
    assert calls_counted("unreachable") == unreachable
