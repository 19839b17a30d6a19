"""References in scripted tool arguments to what earlier tool results returned.

A script cannot know ids the host makes up at run time (an `evidence_id`, an `invocation_id`),
so a string argument of the exact form `${CALL_ID.path}` is replaced by the value at `path`
(dot-separated keys or list indexes) in the result the model received for the call `CALL_ID`
in this round (`remembered` keeps results compaction has since left out of the history),
e.g. `"${q1.evidence_id}"` or `"${c2.result.rows.0.value}"`. A reference that does not
resolve is left as written, so the tool sees (and refuses) it like any wrong id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["resolve_refs"]

_REF = re.compile(r"^\$\{([A-Za-z0-9_.:-]+?)\.([^}]+)\}$")


def resolve_refs(
    arguments: Any,
    messages: Sequence[Mapping[str, Any]],
    remembered: dict[str, Any] | None = None,
) -> Any:
    """A copy of `arguments` (every dict and list in it new, its scalars shared) with every
    resolvable `${CALL_ID.path}` replaced; a replacement is the result's value itself. With
    `remembered` (kept by the caller across the round's turns, empty at first), the results in
    `messages` are added to it and a reference is looked up there (every turn's results are
    added, referred to or not); a call id used again refers to its latest result, as without
    it."""
    results = None if remembered is None else _tool_results(messages, remembered)

    def walk(value: Any) -> Any:
        nonlocal results
        if isinstance(value, str):
            match = _REF.match(value)
            if match is None:
                return value
            if results is None:
                results = _tool_results(messages, remembered)
            read = results.get(match.group(1))
            found = _lookup(None if read is None else read[1], match.group(2).split("."))
            return value if found is _MISSING else found
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        return value

    return walk(arguments)


_MISSING = object()


def _tool_results(
    messages: Sequence[Mapping[str, Any]], remembered: dict[str, Any] | None
) -> dict[str, Any]:
    """Each call id's latest readable result, as `(its text, its value)`; `remembered` keeps
    them across turns, so a result read on an earlier turn is not parsed again (its text is
    the same object), and one compaction has left out is still there."""
    found: dict[str, Any] = {} if remembered is None else remembered
    for message in messages:
        if message.get("role") != "tool":
            continue
        call_id = str(message.get("tool_call_id"))
        content = str(message.get("content"))
        known = found.get(call_id)
        if known is not None and (known[0] is content or known[0] == content):
            continue  # read on an earlier turn
        try:
            found[call_id] = (content, json.loads(content))
        except ValueError:
            continue
    return found


def _lookup(value: Any, path: list[str]) -> Any:
    if value is None:
        return _MISSING
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return _MISSING
    return value
