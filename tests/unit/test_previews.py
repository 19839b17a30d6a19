"""A large result's preview in a small context window (`ResultRoom.preview_fit`,
`ToolHost._page`): a result a little over its room is shown whole when that takes no more room
than its preview would, and a room too small for a preview worth showing shows none of it but
says how to read it, never `{`."""

from __future__ import annotations

import json
import threading

import pytest

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.model import ScriptedModel
from orchestrator.agent.request import AgentContext, RequestBuilder
from orchestrator.agent.result_room import _PREVIEW_AROUND, ResultRoom
from orchestrator.tools.base import ToolCall, ToolContext, ToolResult
from orchestrator.tools.results import (
    NO_PREVIEW_NOTE,
    PREVIEW_CHARS,
    ReadToolResult,
    ResultCache,
)
from tests.unit.test_host import Echo

CTX = ToolContext(owner="o", session_id="s", round_id="r")


def _turn(
    window: int, times: list[int], preview_chars: int = PREVIEW_CHARS
) -> tuple[RequestBuilder, ToolHost, list[ToolResult]]:
    """One turn of `echo` calls (one per count: `WORD` that many times) in a window of `window`
    tokens, through the request builder's fit: what the model is answered."""
    cache = ResultCache()
    host = ToolHost(
        [Echo(), ReadToolResult(cache)], ledger=None, results=cache, preview_chars=preview_chars
    )
    builder = RequestBuilder(
        ScriptedModel([]),
        host.tools,
        host.schemas(),
        CTX,
        system="s",
        brief="b",
        stop=threading.Event(),
        context=AgentContext(ContextBudget(window, max_output_tokens=128), TokenCounter()),
    )
    builder.build()
    calls = [
        ToolCall(f"c{n}", "echo", {"text": WORD, "times": count}) for n, count in enumerate(times)
    ]
    builder.add_assistant(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in calls
            ],
        }
    )
    return builder, host, host.run_turn(builder.ctx, calls)


#: What the echo tool repeats: a result of any length, from short arguments.
WORD = "DM-RN-01 turbidity 4.2 NTU; "


@pytest.mark.parametrize("window", [600, 700])
def test_a_result_no_larger_than_its_preview_would_be_is_shown_whole(window: int) -> None:
    """A preview's own keys (about 100 tokens with its result id) take most of a small room:
    in 600 tokens (a room of 64) a result a little larger than its room was cut to one
    character, and in 700 (a room of 135) one that fit its room was cut to a third of it, each
    in an answer as large as the whole result. A result that takes no more than its preview's
    answer would is now shown whole."""
    builder, _, _ = _turn(window, [1])
    counter = builder.context.counter  # type: ignore[union-attr]
    room = _room_of(builder)._room()
    keys = counter.text(_PREVIEW_AROUND) + 32
    most = max(room, keys) - 4
    count = max(n for n in range(1, 400) if counter.text(json.dumps(WORD * n)) <= most)
    assert counter.text(json.dumps(WORD * count)) > min(room, 100) - keys + 10
    [result] = _turn(window, [count])[2]
    assert result.payload == WORD * count


def test_a_room_too_small_for_a_preview_shows_none_and_says_how_to_read_it() -> None:
    """In 600 tokens a result has a room of 64, less than a preview's keys: its preview was one
    character. Now it shows none of the result and says to read it with read_tool_result from
    offset 0 (in a later turn), which gives the whole text."""
    _, host, [result] = _turn(600, [300])
    shown = result.payload
    assert shown["truncated"] is True
    assert shown["preview"] == ""
    assert shown["next_offset"] == 0
    assert shown["total_chars"] == len(WORD * 300)
    assert shown["note"] == NO_PREVIEW_NOTE
    assert "read_tool_result(result_id, offset)" in NO_PREVIEW_NOTE
    page = host.tools["read_tool_result"].run(
        CTX, ReadToolResult.arguments(result_id=shown["result_id"], offset=0)
    )
    assert page.payload["content"] == WORD * 300


def test_the_start_of_a_longer_result_is_never_shown_as_if_it_were_whole() -> None:
    """The first `preview_chars` of a result take no more than its preview's answer would,
    but are not the whole result: they are held to the room a preview's text has (in 700
    tokens, 37 of a 135-token room: too few for a preview worth showing)."""
    builder, _, _ = _turn(700, [1])
    counter = builder.context.counter  # type: ignore[union-attr]
    keys = counter.text(_PREVIEW_AROUND) + 32
    assert _room_of(builder)._room() - keys < 48
    cut = max(n for n in range(1, 2000) if counter.text(json.dumps((WORD * 300)[:n])) <= keys)
    [result] = _turn(700, [300], preview_chars=cut)[2]
    assert (result.payload["preview"], result.payload["note"]) == ("", NO_PREVIEW_NOTE)


def _room_of(builder: RequestBuilder) -> ResultRoom:
    """The builder's room of the running turn's results (it has a window)."""
    assert builder.room is not None
    return builder.room
