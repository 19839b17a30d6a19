"""The loop's messages in the OpenAI chat-completions wire format, checked for strict servers.

The loop keeps assistant turns as `{"role": "assistant", "content", "tool_calls": [{"id",
"name", "arguments": dict}], "reasoning_content"?}`. On the wire a call is `{"id", "type":
"function", "function": {"name", "arguments": JSON text}}`, an empty `tool_calls` is left out,
and `reasoning_content` goes back only with a turn that called tools (DeepSeek, vLLM and Qwen
want it there and nowhere else). Strict servers refuse a history in which an assistant tool call
is not answered by exactly one tool message, in order, before any other message: `check_history`
refuses the same, so a broken history is our bug, reported before anything is sent.

Text that is not the model's own (a tool result, the task's context from the business backend,
a person's note) may hold a chat-template control token such as `<|im_start|>`, `<|eot_id|>` or
DeepSeek's (with fullwidth bars, U+FF5C); a server that renders the template and tokenizes the
result (vLLM, Ollama) would read it as markup and let the text open a system or an assistant
turn. On the wire a bar next to an angle bracket becomes U+2223 DIVIDES: still readable, no
longer the token. The system prompt is the host's and left as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from orchestrator.agent.model import ModelTurn

__all__ = [
    "HistoryError",
    "assistant_message",
    "check_history",
    "neutral_markup",
    "to_wire_messages",
    "to_wire_tools",
]


class HistoryError(ValueError):
    """A history a strict server would refuse."""


def assistant_message(turn: ModelTurn) -> dict[str, Any]:
    """The loop's record of one model turn (what the next request sends back)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn.content,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls
        ],
    }
    if turn.reasoning_content is not None:
        message["reasoning_content"] = turn.reasoning_content
    return message


def to_wire_tools(schemas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host's `{"name", "description", "parameters"}` as OpenAI function tools."""
    wire: list[dict[str, Any]] = []
    for schema in schemas:
        if schema.get("type") == "function" and "function" in schema:
            wire.append(schema)
            continue
        wire.append({"type": "function", "function": schema})
    return wire


#: A bar (ASCII or fullwidth, U+FF5C) that opens or closes a control token: `<|`, `|>`.
_MARKUP = re.compile("(?<=<)[|\uff5c]|[|\uff5c](?=>)")
_DIVIDES = "\u2223"


def neutral_markup(text: str) -> str:
    """`text` with every chat-template control token broken (the same object when none)."""
    if "|" not in text and "\uff5c" not in text:
        return text
    return _MARKUP.sub(_DIVIDES, text)


def to_wire_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loop's messages as chat-completions messages (control tokens broken outside the
    system prompt)."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") != "assistant":
            content = message.get("content")
            if message.get("role") != "system" and isinstance(content, str):
                neutral = neutral_markup(content)
                if neutral is not content:
                    message = {**message, "content": neutral}
            wire.append(message)
            continue
        calls = message.get("tool_calls") or []
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if calls:
            out["tool_calls"] = [_wire_call(call) for call in calls]
            reasoning = message.get("reasoning_content")
            if reasoning is not None:
                out["reasoning_content"] = reasoning
        elif out["content"] is None:
            out["content"] = ""
        wire.append(out)
    return wire


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    if "function" in call:
        return call
    arguments = call.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def check_history(wire: Sequence[dict[str, Any]]) -> None:
    """Raise `HistoryError` unless every tool call is answered at once, in order, exactly once."""
    waiting: list[str] = []
    for index, message in enumerate(wire):
        role = message.get("role")
        if role == "tool":
            if not waiting:
                raise HistoryError(f"message {index}: a tool message that answers no open call")
            expected = waiting.pop(0)
            if message.get("tool_call_id") != expected:
                raise HistoryError(
                    f"message {index}: tool message for {message.get('tool_call_id')!r} where "
                    f"the answer to {expected!r} was due"
                )
            continue
        if waiting:
            raise HistoryError(
                f"message {index} ({role}) comes before the answers to {', '.join(waiting)}"
            )
        if role == "assistant":
            ids = [call["id"] for call in message.get("tool_calls") or []]
            if len(set(ids)) != len(ids):
                raise HistoryError(f"message {index}: one assistant turn repeats a call id")
            waiting = ids
    if waiting:
        raise HistoryError(f"the calls {', '.join(waiting)} have no answer")
