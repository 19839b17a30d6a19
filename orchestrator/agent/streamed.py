"""A streamed answer to a request that did not ask for a stream, read as the one reply it holds.

Some gateways and self-hosted servers stream whatever they are asked (`text/event-stream`, a
`data: {chat.completion.chunk}` event per piece, then `data: [DONE]`), also to a request
without `"stream": true`. The `openai` client then returns the body as text (it parses JSON
only), and that text was retried as "not readable" until the round ended `model_error`
without a hint, on every round: nothing an operator could see said the server had streamed.
The chunks hold the whole reply, so it is put back together here as OpenAI does for a
stream: the content and the reasoning deltas in order, each tool call's pieces by its
`index` (its id, type and name from the first piece that has them, its arguments appended),
the last `finish_reason`, and `usage` from whichever chunk carries it. Legacy
`delta.function_call` pieces are joined the same way.

A body that is not an event stream at all (a proxy's error page) is not this module's: it is
unreadable as before. A stream that carries an `error` event, no chunk of a completion, or
ends with neither a `finish_reason` nor `[DONE]` (cut off on the way), is refused with a reason
that says the server streamed, so the operator can look at the gateway's settings.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["StreamError", "assembled", "is_event_stream"]

#: What the first line of an event stream can be (the SSE fields and a comment).
_FIELDS: Final = ("data:", "event:", "id:", "retry:", ":")
#: The reason's opening: the operator learns the server streamed to a plain request.
STREAMED: Final = (
    "the model server answered with an event stream (text/event-stream) to a request that "
    "did not ask for one"
)


class StreamError(Exception):
    """An event stream that holds no readable reply; the message says why, in one line."""


def is_event_stream(text: str) -> bool:
    """Whether `text` is the body of an event stream (its first line is an SSE field)."""
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith(_FIELDS)


def assembled(text: str) -> dict[str, Any]:
    """The chat completion the chunks of the event stream `text` add up to."""
    head: dict[str, Any] = {}
    content: list[str] = []
    reasoning: dict[str, list[str]] = {}
    calls: dict[tuple[int, int], dict[str, Any]] = {}
    function_call: dict[str, str] | None = None
    finish_reason: Any = None
    usage: Any = None
    chunks = 0
    done = False
    for data in _events(text):
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError(f"{STREAMED}, and an event of it is not JSON") from None
        except RecursionError:  # nested past what json reads: unreadable, as above
            raise StreamError(f"{STREAMED}, and an event of it is nested too deeply") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"{STREAMED}, and an event of it is not a JSON object")
        if chunk.get("error") or chunk.get("object") == "error":
            # `{"error": ...}` (OpenAI, gateways), or the error itself (older vLLM's
            # `{"object": "error", "message": ...}`), which read as a chunk without choices.
            error = chunk.get("error") or chunk.get("message") or "no message"
            if isinstance(error, dict):
                error = error.get("message", error)
            said = " ".join(str(error).split())
            raise StreamError(f"{STREAMED}, which ended in an error: {said}")
        chunks += 1
        if not head:
            head = {key: chunk[key] for key in ("id", "created", "model") if key in chunk}
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            continue
        for choice in choices:
            # The first choice is the reply (`n` is never asked for).
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason") is not None:
                finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or choice.get("message")
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for field in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(field), str):
                    reasoning.setdefault(field, []).append(delta[field])
            pieces = delta.get("tool_calls")
            for piece in pieces if isinstance(pieces, list) else []:
                if isinstance(piece, dict):
                    _add_call_piece(calls, piece)
            if isinstance(delta.get("function_call"), dict):
                function_call = function_call or {"name": "", "arguments": ""}
                _join_function(function_call, delta["function_call"])
    if not chunks:
        raise StreamError(f"{STREAMED}, and it holds no chunk of a completion")
    if not done and finish_reason is None:
        # Cut off on the way (a proxy's timeout, a dropped connection): what came is the start
        # of the reply, which must not pass for all of it (a final answer cut mid-sentence).
        raise StreamError(f"{STREAMED}, and it ended before the reply did (no finish_reason)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    for field, pieces in reasoning.items():
        message[field] = "".join(pieces)
    if calls:
        message["tool_calls"] = [calls[key] for key in sorted(calls)]
    if function_call is not None:
        message["function_call"] = function_call
    return {
        "id": "",
        "created": 0,
        "model": "",
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def _events(text: str) -> list[str]:
    """The data of each event of the stream (its `data:` lines joined by newlines)."""
    events: list[str] = []
    lines: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if lines:
                events.append("\n".join(lines))
                lines = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        events.append("\n".join(lines))
    return events


def _add_call_piece(calls: dict[tuple[int, int], dict[str, Any]], piece: dict[str, Any]) -> None:
    """One tool-call delta into the call at its `index` (keyed `(index, n)`: the n-th call
    sent under that index). A piece without an index (some gateways send each call whole,
    unnumbered) starts a call of its own when it has an id other than the last call's, and
    continues the last call otherwise. A piece whose id differs from that of the call at its
    index starts a call of its own too: Ollama and some gateways send every call under index 0, and
    joining them made one call of two, its arguments the second's (sent as objects) or both
    texts run together, under the first call's id and name."""
    index, sent = piece.get("index"), piece.get("id")
    if isinstance(index, int):
        key = max((k for k in calls if k[0] == index), default=(index, 0))
        held = calls[key]["id"] if key in calls else ""
        if sent and held and sent != held:
            key = (index, key[1] + 1)
    else:
        last = max(calls) if calls else None
        if last is None:
            key = (0, 0)
        elif sent and calls[last].get("id") != sent:
            key = (last[0] + 1, 0)
        else:
            key = last
    call = calls.setdefault(
        key, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if piece.get("id") and not call["id"]:
        call["id"] = piece["id"]
    if isinstance(piece.get("function"), dict):
        _join_function(call["function"], piece["function"])


def _join_function(into: dict[str, Any], piece: dict[str, Any]) -> None:
    """A function delta's name (the first one sent) and its arguments (appended); arguments
    sent as an object (some servers send each call whole) are kept as that object."""
    name = piece.get("name")
    if isinstance(name, str) and name and not into["name"]:
        into["name"] = name
    arguments = piece.get("arguments")
    if isinstance(arguments, str):
        if isinstance(into["arguments"], str):
            into["arguments"] += arguments
    elif arguments is not None:
        into["arguments"] = arguments
