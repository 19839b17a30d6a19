"""Log lines as text or JSON (ORCH_LOG_FORMAT), with secrets masked in both.

JSON lines carry `ts`, `level`, `logger`, `event` (the message) and, when known, `task_id`,
`generation`, `session_id` and `worker`: `log_context(...)` binds them for the code it wraps (a
Celery task binds task, generation and worker; the execution service adds the session).

`RedactFilter` masks what must never reach a log: bearer tokens, URL passwords, `token=`,
`key=`, `secret=`, `password=` values, and the configured secrets themselves (API and internal
tokens, the store's password, and the path and query of the outbox URLs, where a Slack-style
webhook keeps its secret). A masked value keeps at most its first 4 characters.

An outbox URL's path is masked where it is part of that URL (after its scheme and host) or
stands alone (an error that echoes only the path), not wherever its text appears: an actions
URL `http://backend/actions` must not turn every `/api/v1/actions` of an access line, or the
same path on another host, into `***`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from orchestrator.settings import Settings

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "RedactFilter",
    "Secret",
    "bind_log_context",
    "configure_logging",
    "distinctive",
    "log_context",
    "redact",
    "secrets_of",
]

CONTEXT_FIELDS = ("task_id", "generation", "session_id", "worker")
#: What `redact` masks: a secret's text wherever it appears, or a pattern whose `path` group is
#: masked only where the pattern matches (an outbox URL's path after its own host).
Secret = str | re.Pattern[str]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "orchestrator_log_context", default=MappingProxyType({})
)

_PATTERNS = (
    # Authorization: Bearer abc... / Basic ...
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    # scheme://user:password@host
    (re.compile(r"(://[^/\s:@]*:)[^@\s/]+@"), r"\1***@"),
    # token=..., api_key: "...", "secret": "...", password=...
    (
        re.compile(
            r"(?i)([\"']?\b[\w-]*(?:token|key|secret|password|passwd|authorization)[\"']?"
            r"\s*[:=]\s*[\"']?)([^\s\"'&,;}]+)"
        ),
        r"\1***",
    ),
)


def _mask(secret: str) -> str:
    return secret[:4] + "***" if len(secret) > 8 else "***"


def redact(text: str, secrets: Iterable[Secret] = ()) -> str:
    """`text` with every known secret and every token-shaped value masked."""
    secrets = list(secrets)
    # The URL paths first: a plain secret masked inside a URL would hide the host they follow.
    for secret in secrets:
        if isinstance(secret, re.Pattern):
            text = secret.sub(_mask_path, text)
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4 and secret in text:
            text = text.replace(secret, _mask(secret))
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _mask_path(match: re.Match[str]) -> str:
    return (match.group("origin") or "") + _mask(match.group("path"))


def secrets_of(settings: Settings) -> list[Secret]:
    """The configured secret values, longest first (so a secret inside another is not split),
    then the outbox URLs' paths as patterns that find them after their own host."""
    found = [settings.api_token or "", settings.agent_internal_token or ""]
    for name in ("llm_api_key", "actions_secret", "webhook_secret", "console_secret"):
        value = getattr(settings, name, None)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            found.append(value)
    with suppress(ArgumentError):
        found.append(make_url(settings.store_url).password or "")
    plain: list[Secret] = [*sorted({s for s in found if s}, key=len, reverse=True)]
    paths = (_url_path(getattr(settings, name, None)) for name in ("actions_url", "webhook_url"))
    return plain + [pattern for pattern in paths if pattern is not None]


def distinctive(secret: str) -> bool:
    """Whether a configured secret is looked for in what the model writes and in a command's
    environment: 8 characters or more, and not letters alone. A log line masks every secret
    (`redact`); there a word lost to `***` costs nothing, but a store password such as
    `postgres` or `orchestrator` would turn that word into `***` in every report and every
    command the model runs, and drop every variable that holds it (a PATH through
    `/usr/lib/postgresql`) from a command's environment."""
    return len(secret) >= 8 and not secret.isalpha()


def _url_path(url: str | None) -> re.Pattern[str] | None:
    """The path and query of an outbox URL where they follow its scheme and host (any user
    part and port between), as configured and as httpx logs it (encoded): a Slack-style webhook
    (`/services/T000/B000/XXXX`) carries its secret there, and httpx logs every request's URL
    at INFO. The host stays readable; the same text elsewhere in a line is left alone."""
    if not url:
        return None
    import httpx  # here: only an outbox URL set needs it, not every command that masks a line

    try:
        parts = urlsplit(url)
        hosts = {parts.hostname or ""}
        paths = {parts.path + (f"?{parts.query}" if parts.query else ""), parts.path}
    except ValueError:
        return None
    with suppress(httpx.InvalidURL, ValueError, UnicodeDecodeError):
        sent = httpx.URL(url)
        hosts |= {sent.host, sent.raw_host.decode("ascii")}
        raw = sent.raw_path.decode("ascii")
        paths |= {raw, raw.partition("?")[0]}
    hosts.discard("")
    # A bare "/" or a short path hides nothing (and `redact` leaves values under 4 characters).
    paths = {path for path in paths if len(path.strip("/")) >= 3}
    if not parts.scheme or not hosts or not paths:
        return None
    host = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    origin = rf"(?i:{re.escape(parts.scheme)}://(?:[^/\s@]*@)?\[?(?:{host})\]?(?::\d+)?)"
    path = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    # After its own host, or standing alone (an error that echoes only the path): never the
    # end of a longer path (`/actions` in `/api/v1/actions`, or after another host), nor a
    # longer path that only starts alike (`/hook` in `/hooks`); a sub-path is masked.
    return re.compile(rf"(?:(?P<origin>{origin})|(?<![\w.~%/:-]))(?P<path>{path})(?![\w.~%-])")


class RedactFilter(logging.Filter):
    """Formats the record's message once, masked, and drops the arguments."""

    def __init__(self, secrets: Iterable[Secret] = ()) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.name == "uvicorn.access":
            # uvicorn's access formatter unpacks the arguments: mask them one by one.
            record.args = tuple(
                redact(arg, self.secrets) if isinstance(arg, str) else arg for arg in record.args
            )
        else:
            try:
                message = record.getMessage()
            except Exception:  # a broken format string must not lose the line
                message = str(record.msg)
            record.msg = redact(message, self.secrets)
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        for name in CONTEXT_FIELDS:
            if not hasattr(record, name) and name in _context.get():
                setattr(record, name, _context.get()[name])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        bound = _context.get()
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, bound.get(name))
            if value is not None:
                line[name] = value
        if record.exc_text or record.exc_info:
            line["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(line, ensure_ascii=False, default=str)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind task_id, generation, session_id, worker for the log lines of the wrapped code."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind_log_context(**fields: Any) -> None:
    """Add fields to the current context (inside a `log_context`, they end with it)."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})


def configure_logging(settings: Settings, level: int | str = logging.INFO) -> logging.Handler:
    """The root logger writes to stderr in ORCH_LOG_FORMAT, masked; returns its handler."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactFilter(secrets_of(settings)))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # A library's warning (Celery's superuser one, a deprecation) goes through this handler
    # as one line, masked, instead of `warnings` printing several lines of text to stderr.
    logging.captureWarnings(True)
    return handler
