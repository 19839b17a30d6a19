"""The loop's messages in the OpenAI chat-completions wire format, checked for strict servers.

The loop keeps assistant turns as `{"role": "assistant", "content", "tool_calls": [{"id",
"name", "arguments": dict}], "reasoning_content"?}`. On the wire a call is `{"id", "type":
"function", "function": {"name", "arguments": JSON text}}`, an empty `tool_calls` is left out,
and `reasoning_content` goes back only with a turn that called tools (DeepSeek, vLLM and Qwen
want it there and nowhere else). Strict servers refuse a history in which an assistant tool call
is not answered by exactly one tool message, in order, before any other message: `check_history`
refuses the same, so a broken history is our bug, reported before anything is sent.

Text that is not the model's own (a tool result, the task's context from the business backend,
a person's note) may hold a chat-template control token; a server that renders the template and
tokenizes the result (vLLM, Ollama) would read it as markup and let the text open a system or an
assistant turn, or end the one it is in. On the wire one character of each token changes, so a
person still reads it and no tokenizer does (case matters, as in the tokenizers):

- ChatML, Llama 3, Qwen and the rest of the `<|...|>` family, and DeepSeek's (with fullwidth
  bars, U+FF5C): a bar next to an angle bracket becomes U+2223 DIVIDES (`<|im_start|>` ->
  `<\u2223im_start\u2223>`);
- Llama 2 and Mistral: the opening `[` of `[INST]`, `[/INST]` and Mistral's `[SYSTEM_PROMPT]`,
  `[AVAILABLE_TOOLS]`, `[TOOL_CALLS]`, `[TOOL_RESULTS]` (and their closing forms) becomes U+FF3B
  FULLWIDTH LEFT SQUARE BRACKET; the opening `<` of `<<SYS>>`, `<</SYS>>`, `<s>` and `</s>`
  becomes U+FF1C FULLWIDTH LESS-THAN SIGN (`<<SYS>>` -> `\uff1c<SYS>>`);
- Gemma: the opening `<` of `<start_of_turn>`, `<end_of_turn>`, `<bos>` and `<eos>` becomes
  U+FF1C too;
- the Unicode bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069),
  which reorder what a person sees of the text around them, become U+FFFD REPLACEMENT
  CHARACTER: the text reads in its real order, with a mark where the control was.

Each change keeps the text's length in characters, so the context budget's count still holds.
The system prompt is the host's and the assistant turns are the model's own: both left as they are.
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


# Plain `in` checks and `str.replace` (C searches), and regular expressions that open with a
# literal: this runs on every request over every message but the system prompt.
_DIVIDES = "\u2223"
#: A bar (ASCII or fullwidth, U+FF5C) that opens or closes a control token: `<|`, `|>`.
_BARS = tuple(
    (token, token.replace(bar, _DIVIDES))
    for bar in ("|", "\uff5c")
    for token in (f"<{bar}", f"{bar}>")
)
_SQUARE = re.compile(r"\[(/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\])")
_FULLWIDTH_SQUARE = "\uff3b\\1"
_ANGLE = re.compile(r"<(</?SYS>>|/?s>|(?:start|end)_of_turn>|[be]os>)")
_FULLWIDTH_ANGLE = "\uff1c\\1"
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def neutral_markup(text: str) -> str:
    """`text` with every chat-template control token and bidirectional control broken, as the
    module's docstring lists (the same object when there is none)."""
    if "|" in text or "\uff5c" in text:
        for token, broken in _BARS:
            if token in text:
                text = text.replace(token, broken)
    if "[" in text:
        text = _SQUARE.sub(_FULLWIDTH_SQUARE, text)
    if "<" in text:
        text = _ANGLE.sub(_FULLWIDTH_ANGLE, text)
    if not text.isascii():
        for control in _BIDI:
            if control in text:
                text = text.replace(control, "\ufffd")
    return text


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
