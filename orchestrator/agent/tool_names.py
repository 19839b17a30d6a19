"""Tool names as gpt-oss servers leak them, put back to the tool the model named.

gpt-oss writes a call as `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`
(the harmony format), and the servers that parse it into `tool_calls` do not always cut the
name cleanly: vLLM (issue 32587) and Ollama (issue 12132) have sent
`save_report<|channel|>commentary`, some parsers keep the namespace (`functions.save_report`),
and llama.cpp trims a `json` glued to the name (`save_reportjson`) since its PR 15158 because the
model writes it so. The host refused each `unknown_tool`, and the model, shown its own name back
in the history, often sent it again until the round ended with no report.

The rule is exact, never a guess: a name that is not an offered tool loses, in this order, a
harmony marker and what follows it (from the first `<|`), the `functions.` namespace, and then
a trailing `json`; the name is resolved only when what remains is exactly an offered tool's name.
A write may run under a resolved name: the stripping names one tool or none. Anything else stays
as sent, and the host refuses it `unknown_tool` with the closest names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from difflib import get_close_matches
from typing import Any

from orchestrator.agent.model import ModelTurn

__all__ = ["closest", "named", "resolved"]

_MARKER = "<|"
_NAMESPACE = "functions."
_GLUED = "json"


def resolved(name: str, offered: Collection[str]) -> str | None:
    """The offered tool `name` names by the rule above, or None."""
    if name in offered:
        return name
    bare = name.split(_MARKER, 1)[0].strip().removeprefix(_NAMESPACE).strip()
    if bare in offered:
        return bare
    unglued = bare.removesuffix(_GLUED).rstrip() if bare.endswith(_GLUED) else ""
    return unglued if unglued in offered else None


def named(turn: ModelTurn, tools: Sequence[dict[str, Any]]) -> ModelTurn:
    """`turn` with each leaked name put back (`resolved`); the call keeps what the model sent
    in `sent_name`, which the transcript shows beside the name that ran."""
    if not turn.tool_calls or not tools:
        return turn
    offered = {str(tool.get("function", tool).get("name")) for tool in tools}
    calls = []
    for call in turn.tool_calls:
        name = resolved(call.name, offered)
        if name is None or name == call.name:
            calls.append(call)
        else:
            calls.append(replace(call, name=name, sent_name=call.name))
    return replace(turn, tool_calls=tuple(calls))


def closest(name: str, offered: Collection[str], limit: int = 3) -> list[str]:
    """Up to `limit` offered names most like `name` (its harmony marker and namespace aside)."""
    bare = name.split(_MARKER, 1)[0].strip().removeprefix(_NAMESPACE)
    return get_close_matches(bare, sorted(offered), n=limit, cutoff=0.5)
