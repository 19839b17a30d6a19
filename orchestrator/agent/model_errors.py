"""What a model server's refusal and error say, in words an operator can act on.

The server's own words, one line, cut to 300 characters and never with the API key (a gateway
may echo the request's headers); and for the usual first-run mistakes, which the server's words
do not name, the setting to change: a 404 (LLM_BASE_URL without its /v1, a model the server
does not serve), a 401 or 403 (LLM_API_KEY, or none set), a request past the server's window
(LLM_CONTEXT_WINDOW larger than llama.cpp's -c or vLLM's --max-model-len); and a 200 whose body
is an error object from a base URL whose path names no API version (LM Studio answers
`POST /chat/completions` without its /v1 with a 200 and "Unexpected endpoint or method").

A server that cannot take the request's tools says so in words no retry changes, whatever
its status: llama.cpp's server started without --jinja answers HTTP 500 "tools param requires
--jinja flag" (a 5xx, which is otherwise retried and then handed back for an hour of requeues),
Ollama a 400 "... does not support tools" for a model without tool calling (`tools_refused`).

That answer of LM Studio's says the path is not one it serves: every retry would get the same,
so it is not retried (`wrong_endpoint`). Only those words are taken so: llama.cpp serves the
chat completions at its root too, so a base URL without /v1 may be right, and another error at
200 (a model loading, a proxy's hiccup) may pass and is retried as before.

Gateways put an upstream's status in the error object they send at 200: OpenRouter answers an
upstream rate limit `{"error": {"message": "Provider returned error", "code": 429, "metadata":
{"raw": "... temporarily rate-limited upstream ..."}}}`. Its code (`error_status`) says the
server is rate limiting (429) or away (408, 5xx) as an HTTP status would, and its `raw` says
why in the upstream's words.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import openai

__all__ = [
    "base_path_hint",
    "described",
    "error_of",
    "error_status",
    "redacted",
    "refusal_hint",
    "tools_refused",
    "wrong_endpoint",
]

#: How servers refuse a request past their context window (vLLM and OpenAI "maximum context
#: length", llama.cpp "exceeds the available context size", TGI "must be <= N" of its inputs).
_OVER_CONTEXT = re.compile(
    r"context[ _](length|size|window)|maximum context|max_new_tokens` must be <=", re.IGNORECASE
)


#: The last segment of a base URL's path that names an OpenAI-compatible API: a version (/v1,
#: /v1beta, /v4) or Gemini's and Azure's /openai.
_API_PATH = re.compile(r"v\d+[a-z0-9]*|openai", re.IGNORECASE)


def base_path_hint(base_url: str) -> str:
    """What to add to a 200 carrying an error when LLM_BASE_URL's path names no API version:
    the server answered, but not the chat-completions endpoint; "" otherwise."""
    segments = [part for part in urlsplit(base_url).path.split("/") if part]
    if segments and _API_PATH.fullmatch(segments[-1]):
        return ""
    return (
        "; LLM_BASE_URL's path names no API version: check it (often it ends in /v1, as in "
        "http://HOST:1234/v1)"
    )


#: How servers refuse the tools themselves, and what to change (`tools_refused`).
_NO_TOOLS = (
    (
        re.compile(r"requires --jinja", re.IGNORECASE),
        "; start llama-server with --jinja (tool calling needs its chat templates)",
    ),
    (
        re.compile(r"does not support tools", re.IGNORECASE),
        "; ORCH_MODEL names a model without tool calling on this server: choose a model "
        "that supports tool calling (Ollama: `ollama show MODEL` lists `tools` among its "
        "capabilities)",
    ),
)


def tools_refused(said: str) -> str | None:
    """What to change when the server's words (`said`) refuse the request's tools, which no
    retry changes; None for any other error."""
    return next((hint for words, hint in _NO_TOOLS if words.search(said)), None)


#: LM Studio's answer to a path it does not serve (`POST /chat/completions`, without /v1).
_WRONG_ENDPOINT = "unexpected endpoint or method"


def wrong_endpoint(said: str, base_url: str) -> str | None:
    """The reason to fail at once, not retried, when a 200's error (`said`, as `error_of` gives
    it) is LM Studio's "Unexpected endpoint or method": the request's path is not one the server
    serves, and no retry changes that. None for any other error."""
    if _WRONG_ENDPOINT not in said.lower():
        return None
    hint = base_path_hint(base_url) or (
        "; check that LLM_BASE_URL is the server's API base URL (as in http://HOST:1234/v1)"
    )
    return (
        "the model server does not serve chat completions under LLM_BASE_URL: it answered "
        f"the request's path as an unknown endpoint{said}{hint}"
    )


def redacted(text: str, secret: str | None) -> str:
    """`text` without the API key."""
    return text.replace(secret, "***") if secret else text


def described(exc: openai.APIStatusError, secret: str | None) -> str:
    """A short, one-line, secret-free account of the server's error."""
    body = exc.body
    text: Any = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) else inner
    if not text:
        text = exc.message
    # Redacted before the line is cut: a key across the cut would leave its beginning.
    return redacted(" ".join(str(text).split()), secret)[:300]


def error_of(completion: Any, secret: str | None) -> str:
    """What a 200 without choices says of itself (`{"error": ...}`, which some servers and
    gateways send with a 200), secret-free, for the reason; "" when nothing."""
    error = _error_object(completion)
    if isinstance(error, dict):
        metadata = error.get("metadata")
        raw = metadata.get("raw") if isinstance(metadata, dict) else None
        error = error.get("message", error)
        if isinstance(raw, str) and raw.strip():
            error = f"{error}: {raw}"  # the upstream's own words (OpenRouter)
    if not error:
        return ""
    return f" (its error: {redacted(' '.join(str(error).split()), secret)[:300]})"


def error_status(completion: Any) -> int | None:
    """The status a 200 without choices carries in its error object's `code` when it says the
    server is rate limiting or away (408, 429, 5xx), or None."""
    error = _error_object(completion)
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return code if code in (408, 429) or 500 <= code <= 599 else None


def _error_object(completion: Any) -> Any:
    error = getattr(completion, "error", None)
    if error is None and getattr(completion, "model_extra", None):
        error = completion.model_extra.get("error")
    return error


def refusal_hint(
    status: int, said: str, model: str, context_window: int | None, secret: str | None
) -> str:
    """What to add to a refusal (`said`: the server's words) that names the setting to
    change; "" when nothing is known to."""
    no_tools = tools_refused(said)
    if no_tools is not None:
        return no_tools
    if status == 404:
        # The usual first-run mistakes, which the server's "Not Found" names neither.
        return (
            "; check that LLM_BASE_URL includes the API's base path (often /v1, as in "
            f"http://HOST:8000/v1) and that the server serves the model {model!r}"
        )
    if status in (401, 403):
        # The server's words name a key the operator never set ("not-needed", which the
        # client sends when LLM_API_KEY is unset) or none at all.
        if secret:
            return "; check LLM_API_KEY (set)"
        return "; LLM_API_KEY is not set: set it to the server's key"
    if _OVER_CONTEXT.search(said) and context_window:
        # The server's window is smaller than the one the agent budgets for: every round
        # would fail the same way (llama.cpp's -c, vLLM's --max-model-len).
        return (
            f"; LLM_CONTEXT_WINDOW is {context_window}: set it to the server's context size "
            "(llama.cpp -c, vLLM --max-model-len, Ollama num_ctx) so that requests are "
            "compacted within it"
        )
    return ""
