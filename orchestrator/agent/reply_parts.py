"""Reading the pieces of a model's reply: its calls' arguments, content sent as parts, a call
in the legacy shape, ids that count a turn's calls, and a final reply that writes a call as text.

Each is how some server or proxy really answers (see `openai_model`, which reads a reply with
these); none keeps state, so the conversation's own rules (ids across turns) stay there.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import openai

from orchestrator.agent.model import ModelTurn
from orchestrator.agent.text import clean, clean_text
from orchestrator.agent.text_calls import closing_call, thought_call, written_call

__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "MAX_RAW_ARGUMENT_CHARS",
    "arguments_of",
    "as_calls",
    "called_in_thinking",
    "counters",
    "id_text",
    "legacy_call",
    "parts_text",
    "raw_text",
    "shape_problem",
    "short_id",
    "token_count",
    "too_deep",
]

#: How much of unreadable tool-call arguments the transcript keeps, so an operator sees what the
#: model sent.
MAX_RAW_ARGUMENT_CHARS = 500
#: An id that counts a turn's calls: a number of up to four digits, alone or after a prefix
#: that ends in a separator (`0`, `call_0`, `functions.write_note:1`).
_COUNTER = re.compile(r"(?:.*[^0-9A-Za-z])?(\d{1,4})", re.DOTALL)


def shape_problem(choice: Any) -> str | None:
    """What makes a completion's first choice unreadable (a message, a tool call or a usage
    that is not an object, content that is neither text nor parts), or None. The `openai`
    client builds a completion without checking it, so a server's wrong shape reached the
    reading as an `AttributeError` and failed the task "agent error" with a traceback."""
    message = getattr(choice, "message", None)
    if not isinstance(message, openai.BaseModel):
        return "its choice has no message object"
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str | list):
        return f"its content is {json_kind(content)}, neither text nor parts"
    calls = getattr(message, "tool_calls", None)
    if calls is not None and not isinstance(calls, list):
        return "its tool_calls is not a list"
    for call in calls or []:
        function = getattr(call, "function", None)
        if not isinstance(call, openai.BaseModel) or not isinstance(
            function, openai.BaseModel | None
        ):
            return "a tool call, or its function, is not an object"
    legacy = getattr(message, "function_call", None)
    if not isinstance(legacy, openai.BaseModel | None):
        return "its function_call is not an object"
    return None


def id_text(call: Any) -> str:
    """A tool call's id as text: some servers send a number; "" for none (or any other
    value: the host then gives the call an id of its own)."""
    value = getattr(call, "id", None)
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return ""


def token_count(usage: Any, name: str) -> int:
    """A count of the reported usage (`prompt_tokens`), 0 when it is missing or no count."""
    value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def legacy_call(message: Any) -> list[Any]:
    """The one call of a reply in the shape before tool calls (`message.function_call`,
    `finish_reason` `function_call`), still sent by older gateways and self-hosted servers; []
    when the reply has none. It has no id: the host gives it one of its own (`_turn`)."""
    function = getattr(message, "function_call", None)
    if function is None or not getattr(function, "name", None):
        return []
    return [SimpleNamespace(id=None, function=function)]


def counters(ids: Sequence[str]) -> bool:
    """Whether a turn's ids count its calls from 0 or from 1 (`0`, `call_0`, `call_1`,
    Kimi's `functions.NAME:0`): a number alone, or after a prefix ending in a separator, the
    first call's 0 or 1. An id of a server's own does not (`call_a1`, `chatcmpl-tool-9f2c`).
    (A number repeated within the turn is refused as such, whatever the shape.)"""
    matches = [_COUNTER.fullmatch(call_id) for call_id in ids if call_id]
    if not matches or any(match is None for match in matches):
        return False
    first = matches[0]
    return first is not None and int(first.group(1)) in (0, 1)


def as_calls(turn: ModelTurn, tools: Sequence[dict[str, Any]]) -> ModelTurn:
    """`turn`, with why it is no answer (`unparsed`) when it is a final reply that calls an
    offered tool as text, or in its thinking (`text_calls`): with no text beside it, or with
    text written after a call that closes the thinking (`text_calls.closing_call`). The server
    does not parse this model's tool calls as text, and no turn of the round will differ; the
    thinking's call is asked again first (`called_in_thinking`)."""
    if not turn.final or not tools:
        return turn
    names = _names(tools)
    thought = _thought_call(turn, names)
    if thought is not None:
        beside = (
            "no call and no text"
            if not (turn.content or "").strip()
            else "no call, only text the model wrote after it (no answer: the call never ran)"
        )
        return replace(
            turn,
            unparsed=(
                f"the model wrote a call of {thought} inside its thinking (reasoning_content) "
                f"and the server returned {beside}: the server's reasoning parser "
                "keeps such a call from its tool parser (vLLM issue #39056, --reasoning-parser "
                "qwen3): start vLLM without --reasoning-parser, or with "
                "--default-chat-template-kwargs '{\"enable_thinking\": false}', or on a "
                "release that parses calls inside the thinking"
            ),
        )
    name = written_call(turn.content, names)
    if name is None:
        return turn
    return replace(
        turn,
        unparsed=(
            f"the model wrote a call of {name} as text instead of calling it: the server does not "
            "parse this model's tool calls (vLLM: start it with --enable-auto-tool-choice and the "
            "model's --tool-call-parser (gpt-oss: openai); llama.cpp: --jinja; Ollama, LM Studio: "
            "a model whose chat template supports tools)"
        ),
    )


def called_in_thinking(turn: ModelTurn, tools: Sequence[dict[str, Any]]) -> bool:
    """Whether `turn` is a final reply whose thinking holds a call of an offered tool, with no
    text beside it or only text written after it (`as_calls` says why it is no answer). vLLM
    issue #39056 strikes some replies of a model, not all, so such a reply is asked again,
    unlike a call written as text."""
    if not turn.final or not tools:
        return False
    return _thought_call(turn, _names(tools)) is not None


def _thought_call(turn: ModelTurn, names: list[str]) -> str | None:
    """The offered tool a final reply calls in its thinking and not otherwise: its thinking's
    call when it has no text; when it has, the call that closes its thinking, unless the text
    is itself a call written as text (the server parses no call at all: `written_call`)."""
    if turn.cut_off is not None:
        return None
    if not (turn.content or "").strip():
        return thought_call(turn.reasoning_content, names)
    if written_call(turn.content, names) is not None:
        return None
    return closing_call(turn.reasoning_content, names)


def _names(tools: Sequence[dict[str, Any]]) -> list[str]:
    return [str(tool.get("function", tool).get("name")) for tool in tools]


def short_id(call_id: str) -> str:
    return call_id if len(call_id) <= 40 else call_id[:39] + "…"


def raw_text(raw: Any) -> str:
    """The beginning of arguments that could not be read, as text the store can hold."""
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raw = json.dumps(raw, ensure_ascii=False, default=str)
    return clean_text(raw[:MAX_RAW_ARGUMENT_CHARS])


def arguments_of(raw: Any) -> tuple[dict[str, Any], str | None]:
    """The call's arguments as an object, or `{}` and why they cannot be read. JSON text, as
    the API says; some servers and proxies send the object itself."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            # Some of json's messages end in "at" ("Unterminated string starting at").
            where = "" if exc.msg.endswith(" at") else " at"
            return {}, f"the arguments are not valid JSON ({exc.msg}{where} character {exc.pos})"
        except RecursionError:  # a looping model's `[[[[...`: past what json reads
            return {}, _TOO_DEEP
    else:
        value = raw
    if too_deep(value):
        # Every reader after this one (the schema, the transcript's redaction) recurses.
        return {}, _TOO_DEEP
    if isinstance(value, str) and value.strip().startswith("{"):
        # Encoded twice by the server or a proxy (a JSON string holding the JSON object): the
        # model wrote an object and cannot correct what the server did to it.
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if not isinstance(value, dict):
        return {}, f"the arguments must be a JSON object, not {json_kind(value)}"
    return clean(value), None


#: How deep the host reads a call's arguments: no tool's schema comes near (the business
#: API's models stop at 12 levels), and deeper ones would exhaust the readers that recurse.
MAX_ARGUMENT_DEPTH = 100
_TOO_DEEP = f"the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"


def too_deep(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Is `value` (parsed JSON) nested more than `limit` objects or lists deep? Walked level by
    level without recursion, so a value of any depth is judged."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            item
            for container in level
            if isinstance(container, dict | list)
            for item in (container.values() if isinstance(container, dict) else container)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list) for item in level)


def parts_text(parts: list[Any]) -> tuple[str | None, str | None]:
    """The text and the thinking of content sent as parts (`{"type": "text", "text"}`,
    `{"type": "thinking", "thinking": text or parts}`); None for what has none."""
    text: list[str] = []
    thinking: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind in ("thinking", "reasoning"):
            inner = part.get(kind, part.get("text"))
            if isinstance(inner, list):
                inner = parts_text(inner)[0]
            if isinstance(inner, str):
                thinking.append(inner)
    return ("".join(text) if text else None), ("".join(thinking) if thinking else None)


def json_kind(value: Any) -> str:
    """What a value is called in JSON, which the model writes (not its Python type's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
