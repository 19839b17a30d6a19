"""Tool-call arguments as gpt-oss servers leak them, read without the harmony markers.

gpt-oss writes a call's arguments as `<|constrain|>json<|message|>{...}<|call|>` (the harmony
format), and a server that parses it into `tool_calls` does not always cut the arguments
cleanly: `{"a": 1}<|call|>` (the end of the call) or `<|message|>{"a": 1}` reached the host,
which answered `invalid_arguments` ("not valid JSON"); the model, shown its call back without
the markers, could not see what to correct and sent it again until the round ended.

The rule is exact, as for the names (`agent.tool_names`), never a guess: only arguments that
are not JSON as sent are read again, without the known markers at their ends (before:
`<|constrain|>json` and/or `<|message|>`; after: any of `<|call|>`, `<|end|>`, `<|return|>`),
and only when what remains is a JSON object. Anything else stays as sent and is answered as
before. The transcript's call keeps what was cut (`arguments_markers`), so an operator sees
what the server sent.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.agent.reply_parts import arguments_of

__all__ = ["read_arguments"]

_BEFORE = re.compile(r"\A\s*(?:<\|constrain\|>\s*json\s*)?(?:<\|message\|>)?")
_AFTER = re.compile(r"(?:\s*<\|(?:call|end|return)\|>)+\s*\Z")


def read_arguments(raw: Any) -> tuple[dict[str, Any], str | None, dict[str, str] | None]:
    """The call's arguments, or `{}` and why not (`reply_parts.arguments_of`), and the markers
    cut to read them (`{"before": ..., "after": ...}`, the parts cut) or None."""
    arguments, problem = arguments_of(raw)
    if problem is None or not isinstance(raw, str):
        return arguments, problem, None
    before = _BEFORE.match(raw)
    head = before.group(0) if before and "<|" in before.group(0) else ""
    rest = raw[len(head) :]
    after = _AFTER.search(rest)
    tail = after.group(0) if after else ""
    if not head and not tail:
        return arguments, problem, None
    inner = rest[: len(rest) - len(tail)]
    if not inner.strip().startswith("{"):
        return arguments, problem, None  # only an object is a call's arguments
    unmarked, still = arguments_of(inner)
    if still is not None:
        return arguments, problem, None
    cut = {"before": head.strip(), "after": tail.strip()}
    return unmarked, None, {side: text for side, text in cut.items() if text}
