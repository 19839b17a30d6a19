"""Which tool calls are sensitive, and their argument values redacted.

A sensitive operation (`sensitive_read`, or a business operation marked `x-sensitive`) keeps its
argument values and its result's body out of everything that outlives the model's own view of
them: the transcript (`agent.transcript`) and a compaction's summary request
(`agent.compaction`), whose answer the transcript records as it is. A tool's secret arguments
(a command's `env`) keep their values out of the same.

A call of a tool the host does not have (`unknown_tool`), or one whose arguments its tool
refused (an extra `password`, a wrong type: `invalid_arguments`), has no schema that vouches for
its arguments, and a model that put a password or an API key into a mistaken call would leak it
to everyone who reads the transcript. Those arguments are hidden by a conservative rule
(`hide_unknown_arguments`, `kept_arguments`): the values under a secret-looking key, at any
depth, become `***`, a configured secret's text becomes `***` wherever it appears, and the
rest of every other value is masked as the logs mask theirs (`orchestrator.logs.redact`: bearer
tokens, `password=...`). The keys
and the shape stay, so an operator still sees what the model got wrong. In the arguments a tool
accepted, a configured secret's text is still masked wherever it appears (`hide_configured`):
none belongs in a record. "Wherever" includes a dict's keys (a model that writes
`{"sk-...": "prod"}` as a query's parameters), not only its values; and a tool's result, which
the host masks the same way before anyone keeps or reads it (`agent.host`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from orchestrator.logs import Secret, distinctive, redact
from orchestrator.tools.base import Tool, ToolResult

__all__ = [
    "MASKED_NOTE",
    "REDACTED",
    "RESULT_MASKED_NOTE",
    "ResultMask",
    "hide_configured",
    "hide_cut_secret",
    "hide_secret_arguments",
    "hide_unknown_arguments",
    "is_sensitive",
    "kept_arguments",
    "may_be_sensitive",
    "noted",
    "redact_values",
]

REDACTED = "***"
#: Added to the result of a write whose arguments held a configured secret (never the secret).
MASKED_NOTE = (
    "a configured secret (an API key, token or password of this deployment) in the arguments "
    "was replaced by *** before the call ran, and is not kept; do not copy secrets into what "
    "you write or run"
)
#: Added to a result in which a configured secret was masked (never the secret).
RESULT_MASKED_NOTE = (
    "a configured secret (an API key, token or password of this deployment) in this result was "
    "replaced by ***; it is neither shown to you nor kept"
)
#: Keys whose value says which operation was called, not with what: kept when redacting.
_KEEP_KEYS = frozenset({"operation_id"})
#: A key whose value may be a secret, in arguments no schema describes: the words the logs mask
#: after (`token=`, `api_key:`, `password=`, `Authorization:`) and their usual kin.
_SECRET_KEY = re.compile(
    r"token|key|secret|passw|pwd|auth|credential|cookie|signature|private", re.IGNORECASE
)


def redact_values(value: Any) -> Any:
    """Every leaf value replaced by `***`; the shape (keys, list lengths) is kept."""
    if isinstance(value, dict):
        return {
            key: item if key in _KEEP_KEYS else redact_values(item) for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact_values(item) for item in value]
    return REDACTED


def hide_secret_arguments(tool: Tool | None, arguments: Any) -> Any:
    """`arguments` with the values of the tool's secret arguments (a command's `env`) as `***`,
    its keys kept: an operator sees that a variable was set, not to what."""
    if tool is None or not tool.secret_arguments or not isinstance(arguments, dict):
        return arguments
    return {
        key: redact_values(value) if key in tool.secret_arguments else value
        for key, value in arguments.items()
    }


def hide_unknown_arguments(arguments: Any, secrets: Iterable[Secret] = ()) -> Any:
    """An unknown tool's `arguments` by the conservative rule above: a secret-looking key's
    value as `***` (its shape kept), every other text, keys included, with `secrets` and
    token-shaped values masked; numbers and booleans as they are."""
    secrets = list(secrets)
    if isinstance(arguments, dict):
        hidden: dict[Any, Any] = {}
        for key, value in arguments.items():
            # The key by the same rule as a text (a secret written as a key); whether its value
            # is hidden wholly is read from the key as the model wrote it.
            kept = _unused(hide_unknown_arguments(key, secrets), hidden)
            if _SECRET_KEY.search(str(key)):
                hidden[kept] = redact_values(value)
            else:
                hidden[kept] = hide_unknown_arguments(value, secrets)
        return hidden
    if isinstance(arguments, list):
        return [hide_unknown_arguments(item, secrets) for item in arguments]
    if isinstance(arguments, str):
        # A configured secret wholly, as in the arguments a tool accepted (`hide_configured`);
        # the logs' rule keeps its first characters, which a record has no need of.
        return redact(hide_configured(arguments, secrets), secrets)
    return arguments


def hide_configured(arguments: Any, secrets: Iterable[Secret]) -> Any:
    """`arguments` with the text of each configured secret (`orchestrator.logs.secrets_of`'s
    plain ones that cannot be a word: `orchestrator.logs.distinctive`) replaced by `***`
    wherever it appears; nothing else."""
    plain = [s for s in secrets if isinstance(s, str) and distinctive(s)]
    if not plain:
        return arguments
    return _masked(arguments, plain)


def hide_cut_secret(text: str, secrets: Iterable[Secret]) -> str:
    """`text`, which was cut to its first characters (a call's unreadable arguments kept to
    `reply_parts.MAX_RAW_ARGUMENT_CHARS`), with the start of a configured secret it ends in
    masked: the cut may fall inside one, which `hide_configured` then does not find whole.
    Four characters or more, as the logs keep at most (`orchestrator.logs.redact`)."""
    for secret in secrets:
        if not isinstance(secret, str) or not distinctive(secret):
            continue
        for length in range(len(secret) - 1, 3, -1):
            if text.endswith(secret[:length]):
                return text[:-length] + REDACTED
    return text


def _masked(value: Any, plain: list[str]) -> Any:
    """`hide_configured` for distinctive `plain` secrets: `value` itself (the same object) when
    it holds none, so a caller keeps what it knows of it (a result's JSON text) and a payload
    of thousands of rows is not copied to find nothing."""
    if isinstance(value, str):
        for secret in plain:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        items = [(_masked(key, plain), _masked(item, plain)) for key, item in value.items()]
        if all(
            new_key is key and new_item is item
            for (new_key, new_item), (key, item) in zip(items, value.items(), strict=True)
        ):
            return value
        hidden: dict[Any, Any] = {}
        for key, item in items:
            hidden[_unused(key, hidden)] = item
        return hidden
    if isinstance(value, list | tuple):
        masked = [_masked(item, plain) for item in value]
        if all(new is old for new, old in zip(masked, value, strict=True)):
            return value
        return masked if isinstance(value, list) else tuple(masked)
    return value


def _unused(key: Any, taken: dict[Any, Any]) -> Any:
    """`key`, or `key (2)`, `key (3)`, ... when a masked key is already in `taken`: two keys
    that differ by a secret (`sk-a...`, `sk-b...`) both stay, neither value is lost."""
    if key not in taken or not isinstance(key, str):
        return key
    number = 2
    while f"{key} ({number})" in taken:
        number += 1
    return f"{key} ({number})"


def kept_arguments(tool: Tool | None, arguments: Any, secrets: Iterable[Secret] = ()) -> Any:
    """A call's arguments as a record keeps them (the transcript, a summary request), for a call
    that is not sensitive (`is_sensitive`): the tool's secret arguments hidden, and arguments no
    schema vouches for (an unknown tool's, or ones the tool refused) by the conservative rule."""
    hidden = hide_secret_arguments(tool, arguments)
    if tool is None or not _valid(tool, arguments):
        return hide_unknown_arguments(hidden, secrets)
    return hide_configured(hidden, secrets)


def _valid(tool: Tool, arguments: Any) -> bool:
    try:
        tool.arguments.model_validate(arguments)
    except Exception:
        return False
    return True


def is_sensitive(tool: Tool | None, arguments: dict[str, Any]) -> bool:
    """Is this call a sensitive operation? Unknown or unreadable calls are treated as not.

    A call whose arguments cannot be validated ran nothing; its arguments are kept so an
    operator sees what the model got wrong, unless the tool itself is sensitive.
    """
    if tool is None:
        return False
    if tool.effect == "sensitive_read":
        return True
    try:
        args = tool.arguments.model_validate(arguments)
        if tool.effect_for(args) == "sensitive_read":
            return True
        operation = getattr(tool, "operation", None)  # the business gateway, per operation
        return bool(operation is not None and getattr(operation(args), "sensitive", False))
    except Exception:
        return False


def may_be_sensitive(tool: Tool | None) -> bool:
    """Could a call of `tool` be sensitive, whatever its arguments? For arguments that cannot
    be read: a tool that is sensitive, or whose effect or operation depends on the arguments
    (the business gateway), keeps them redacted; an unknown tool ran nothing and holds none."""
    if tool is None:
        return False
    if tool.effect == "sensitive_read":
        return True
    per_call = type(tool).effect_for is not Tool.effect_for
    return per_call or getattr(tool, "operation", None) is not None


class ResultMask:
    """Masks the configured secrets in a tool's result, payload (keys included) and message,
    before the host pages, cites or shows it (`agent.host`)."""

    def __init__(self, secrets: Iterable[Secret]) -> None:
        self.secrets = [s for s in secrets if isinstance(s, str) and distinctive(s)]
        forms = {
            form
            for secret in self.secrets
            for form in (secret, json.dumps(secret, ensure_ascii=False)[1:-1])
        }
        #: Any of them in a result's JSON text, as it is or JSON-escaped.
        self._found = (
            re.compile("|".join(map(re.escape, sorted(forms, key=len, reverse=True))))
            if forms
            else None
        )

    def hidden(self, result: ToolResult) -> ToolResult:
        """`result` with every secret masked and `RESULT_MASKED_NOTE` added; `result` itself
        when it holds none (or the same result knowing its payload's JSON text)."""
        if self._found is None:
            return result
        payload = result.payload
        if isinstance(payload, str):
            text: str | None = payload
        else:
            text = result.written_payload()
            if text is None and payload is not None:
                # Written once here (the message and the paging use the same text): a scan of
                # it is about ten times quicker than walking the payload (~0.2 ms for 20 KB).
                with contextlib.suppress(TypeError, ValueError):
                    text = json.dumps(payload, ensure_ascii=False, default=str)
                    result = result.with_payload_text(text)
        if text is None or self._found.search(text) is not None:
            payload = _masked(payload, self.secrets)
        message = hide_configured(result.message, self.secrets)
        if payload is result.payload and message is result.message:
            return result
        return replace(result, payload=payload, message=noted(message, RESULT_MASKED_NOTE))


def noted(message: str | None, note: str) -> str:
    """A result's message with `note` after it."""
    return note if not message else f"{message.rstrip('. ')}. Note: {note}"
