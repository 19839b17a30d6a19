"""A tool call the model wrote as text, because the server did not parse it as one.

A server passes the model's tool calls through its function-calling parser: vLLM with
`--enable-auto-tool-choice` and the model's `--tool-call-parser`, llama.cpp with `--jinja`,
Ollama and LM Studio with a chat template that knows tools. With the wrong parser, or a template
without tools, the call comes back as the reply's text (`<tool_call>{"name": ...}</tool_call>`,
`[TOOL_CALLS]`, `<|python_tag|>`, `<|tool_call|>`, Kimi K2's `<|tool_calls_section_begin|>`,
MiniMax-M2's `<minimax:tool_call>`, Llama's pythonic `[save_report(...)]`, a
bare `{"name": ..., "arguments": ...}`) and no call: the round took it for the final answer,
saved no report, and the task went round by round to its round limit saying only "the round
saved no report". Every reply of such a server is the same,
so the round ends `model_error` at once with a line that says what to fix on the server.

gpt-oss writes in the harmony format, and a server without its parser (vLLM without
`--tool-call-parser openai`) returns the call's messages as text:
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`, often after
its thinking (`<|channel|>analysis<|message|>...<|end|><|start|>assistant...`). Such a reply is
a call when it opens with a harmony marker and a message header in it is addressed
`to=functions.NAME`, NAME an offered tool, exactly; a text that only mentions the markers is an
answer.

A reasoning parser can keep a call from the tool parser: vLLM with `--reasoning-parser qwen3`
puts everything before `</think>` in `reasoning_content`, and a Qwen3 model that writes its
`<tool_call>` inside its thinking gets a reply with the call in the thinking, no call and no
text (vLLM issue #39056). Such a reply is a call when its thinking holds a template's call
markup (not merely prose about a call) for an offered tool: `thought_call`. It is never run
(the server did not return it as a call); the round ends naming the fix, as above.

The same reply may carry text beside the call (`Let me save the report.` after `</think>`).
That text was written after a call the model expected to see answered, not from its result:
it is a preamble, not the round's answer, when the thinking ends with the call
(`closing_call`: after the call's markup come only its body and its closing markers). A model
whose thinking goes on past a call it wrote (`<tool_call>...</tool_call> No: the context
already says so.`) moved on from it, and its text is its answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

__all__ = ["answer_text", "closing_call", "thought_call", "written_call"]

#: How the chat templates of common model families open a tool call.
_MARKUP = re.compile(
    r"^(?:<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>|<function[=>]|<functioncall>|"
    r"<\|tool_call_begin\|>|<\uff5ctool\u2581calls\u2581begin\uff5c>|<tool_calls>|<\|tool_call\|>|"
    # Kimi K2's call section and MiniMax-M2's call (vLLM: kimi_k2, minimax_m2).
    r"<\|tool_calls_section_begin\|>|<minimax:tool_call>)"
)
#: The "pythonic" calls of Llama 3.2 and Llama 4 (vLLM's `--tool-call-parser pythonic`):
#: `[save_report(summary='ok', outcome='completed')]`, in Llama 4's python markers or not.
_PYTHONIC = re.compile(
    r"^(?:<\|python_start\|>)?\s*\[\s*([A-Za-z_][\w.-]*)\(.*\)\s*\]\s*(?:<\|python_end\|>)?$",
    re.DOTALL,
)
#: The same markup anywhere in a text (the thinking leads up to its call).
_MARKUP_ANYWHERE = re.compile(_MARKUP.pattern.removeprefix("^"))
#: How those templates close a call, its arguments or its section (`closing_call`), and the
#: thinking or the turn itself (a server may leave `</think>` or an end token in the thinking).
_CLOSER = re.compile(
    r"</think>|<\|im_end\|>|<\|eot_id\|>|<\|end\|>|<\|call\|>|"
    r"</tool_call>|</function>|</functioncall>|</tool_calls>|</invoke>|</minimax:tool_call>|"
    r"<\|tool_call_end\|>|<\|tool_calls_section_end\|>|<\|python_end\|>|<\|eom_id\|>|"
    r"<\uff5ctool\u2581call\u2581end\uff5c>|<\uff5ctool\u2581calls\u2581end\uff5c>"
)
_THINKING = re.compile(r"^<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
#: How a harmony reply opens, and a message header of it addressed to a tool (the recipient in
#: the role or the channel part, then the channel and constraint, up to the message).
_HARMONY = re.compile(r"^<\|(?:start|channel)\|>")
_HARMONY_CALL = re.compile(
    r"\bto=functions\.([A-Za-z0-9_-]+)[^<]*(?:<\|(?:channel|constrain)\|>[^<]*)*<\|message\|>"
)


def written_call(content: Any, tools: Collection[str]) -> str | None:
    """The name of an offered tool that `content` (a final reply's text) calls as text, or
    None when it is an answer (a text merely naming a tool is one)."""
    if not isinstance(content, str) or not tools:
        return None
    text = _THINKING.sub("", content.strip()).strip()
    if _MARKUP.match(text):
        return next((name for name in tools if name in text), None)
    if _HARMONY.match(text):
        return next((m.group(1) for m in _HARMONY_CALL.finditer(text) if m.group(1) in tools), None)
    pythonic = _PYTHONIC.match(text)
    if pythonic:
        return pythonic.group(1) if pythonic.group(1) in tools else None
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    if not text.startswith(("{", "[")):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict):
            continue
        called = item.get("function", item)
        name = called.get("name") if isinstance(called, dict) else None
        if name in tools and ("arguments" in called or "parameters" in called):
            return str(name)
    return None


def thought_call(reasoning: Any, tools: Collection[str]) -> str | None:
    """The name of an offered tool that `reasoning` (the thinking of a reply with neither text
    nor calls) calls in a template's markup, from its last such markup on, or None."""
    if not isinstance(reasoning, str) or not tools:
        return None
    starts = [match.start() for match in _MARKUP_ANYWHERE.finditer(reasoning)]
    return written_call(reasoning[starts[-1] :], tools) if starts else None


def closing_call(reasoning: Any, tools: Collection[str]) -> str | None:
    """`thought_call`, when that call is the last thing of the thinking: after its markup come
    only its body (a JSON value, or markup up to its last closing marker) and closing markers;
    None when the thinking holds no call or goes on past it."""
    name = thought_call(reasoning, tools)
    if name is None or not isinstance(reasoning, str):
        return None
    *_, opener = _MARKUP_ANYWHERE.finditer(reasoning)
    body = reasoning[opener.end() :]
    closers = list(_CLOSER.finditer(body))
    if closers:
        rest = body[closers[-1].end() :]
    else:
        # No closing marker (`[TOOL_CALLS][{...}]`, a call cut short): the end of its JSON.
        text = body.lstrip()
        try:
            rest = text[json.JSONDecoder().raw_decode(text)[1] :] if text[:1] in "{[" else ""
        except ValueError:
            rest = ""  # the thinking ends inside its call
    return name if not rest.strip() else None


def answer_text(content: str | None) -> str:
    """A final reply's answer: its text without the thinking a server without a reasoning
    parser leaves in it (`<think>...</think>`), stripped; "" for an empty answer."""
    return _THINKING.sub("", (content or "").strip()).strip()
