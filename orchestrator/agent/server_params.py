"""Request parameters a model server refuses, and what is sent instead from then on.

The client sends `max_tokens`, `parallel_tool_calls` with tools and `temperature` when set.
Servers differ: OpenAI's reasoning models (o1, o3, o4-mini, gpt-5) answer 400 "Unsupported
parameter: 'max_tokens' ... Use 'max_completion_tokens' instead" and refuse a `temperature` other
than 1; some gateways and servers refuse `parallel_tool_calls`. Each such 400 (or 422) failed
every round `model_error`. Now the refused parameter is dropped (`max_tokens` becomes
`max_completion_tokens` when the server names it) and the call is made again at once; the
server's answer is remembered per server and model for the process, so later calls send the
adapted body first. A parameter is adapted once: a server that refuses the adapted body too
fails the round as before, with its own reason. A 400 about a parameter's value (OpenAI's
`max_tokens is too large`, which names `param` too) is not a refusal of the parameter: the
round fails with the server's reason, and the setting is fixed rather than ignored.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

__all__ = ["adapt", "refused_parameter"]

log = logging.getLogger(__name__)

#: The optional parameters the client may do without, in the order they are looked for.
_OPTIONAL = ("parallel_tool_calls", "max_tokens", "max_completion_tokens", "temperature")
#: How servers say a parameter is not theirs (OpenAI, vLLM's and TGI's validation, gateways).
_REFUSAL = re.compile(
    r"unsupported|not supported|does not support|unrecognized|unknown (field|param)|"
    r"extra (inputs|fields)|not permitted|not allowed",
    re.IGNORECASE,
)
#: The error codes OpenAI refuses a parameter itself with (whatever the message says).
_REFUSAL_CODES = frozenset({"unsupported_parameter", "unsupported_value", "unknown_parameter"})

_LOCK = threading.Lock()
#: (base URL, model) -> what is done to each refused parameter: dropped (None) or renamed.
_ADAPTED: dict[tuple[str, str], dict[str, str | None]] = {}


def adapt(server: tuple[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """`body` with what `server` refused before dropped or renamed (the same dict when
    nothing was)."""
    with _LOCK:
        adapted = dict(_ADAPTED.get(server, {}))
    if not adapted or not any(name in body for name in adapted):
        return body
    body = dict(body)
    for name, instead in adapted.items():
        if name not in body:
            continue
        value = body.pop(name)
        if instead is not None and instead not in body:
            body[instead] = value
    return body


def refused_parameter(
    server: tuple[str, str], status: int, error: Any, body: dict[str, Any], reason: str
) -> bool:
    """Whether a `status` answer with the error object `error` refused an optional parameter of
    `body` not adapted before; if so it is remembered for `server` (and `adapt` applies it)."""
    if status not in (400, 422):
        return False
    param = error.get("param") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    text = f"{message or ''} {reason}"
    # Refused as a parameter, not for its value: OpenAI names the parameter of a value it
    # refuses too (`max_tokens is too large`, code `invalid_value`), and a value out of range is
    # the operator's to fix (LLM_MAX_OUTPUT_TOKENS), not to leave out and run without the cap.
    if code not in _REFUSAL_CODES and not _REFUSAL.search(text):
        return False
    with _LOCK:
        known = _ADAPTED.setdefault(server, {})
        candidates = [name for name in _OPTIONAL if name in body and name not in known]
        refused = param if param in candidates else None
        if refused is None:
            refused = next((name for name in candidates if name in text), None)
        if refused is None:
            return False
        instead = None
        if refused == "max_tokens" and "max_completion_tokens" in text:
            instead = "max_completion_tokens"
        known[refused] = instead
    log.warning(
        "the model server refused the request parameter %s (%s); %s",
        refused,
        reason,
        f"sending {instead} instead" if instead else "sending requests without it",
    )
    return True
