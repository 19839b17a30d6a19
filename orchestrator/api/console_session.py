"""The console's browser session: a signed cookie that stands for the API token, never holds it.

A browser cannot put a bearer token on an `EventSource`, and a token in a page or a URL leaks.
So the console trades the token once (sign-in form or `/console?token=`) for a cookie
`v1.<expires>.<nonce>.<mac>`, where the MAC is an HMAC-SHA256 keyed by a digest of the token.
Nothing server-side is kept: a restarted API still accepts the cookie, and rotating the token
signs every browser out. The cookie is HttpOnly and SameSite=Strict; a cookie-authenticated
write must also carry `X-Orch-Console: 1`, a header no cross-site form can send.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Sequence

from orchestrator.settings import Settings

__all__ = [
    "COOKIE",
    "SESSION_SECONDS",
    "WRITE_HEADER",
    "accepted_tokens",
    "cookie_allows",
    "cookie_from_headers",
    "issue",
    "token_accepted",
    "valid",
]

COOKIE = "orch_console"
SESSION_SECONDS = 12 * 3600
WRITE_HEADER = b"x-orch-console"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def accepted_tokens(settings: Settings) -> list[str]:
    """The tokens a console user may sign in with; extend here when operator tokens exist."""
    return [settings.api_token] if settings.api_token else []


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def token_accepted(presented: str, tokens: Sequence[str]) -> str | None:
    """The accepted token `presented` equals (compared in constant time), or None."""
    found = None
    for token in tokens:
        if hmac.compare_digest(_digest(presented), _digest(token)):
            found = token
    return found


def _mac(token: str, message: str) -> str:
    key = hashlib.sha256(b"orch-console-session\0" + _digest(token)).digest()
    return hmac.new(key, message.encode("ascii"), hashlib.sha256).hexdigest()


def issue(token: str, now: float | None = None) -> str:
    """A new session cookie value for a browser that presented `token`."""
    expires = int((time.time() if now is None else now) + SESSION_SECONDS)
    message = f"v1.{expires}.{secrets.token_urlsafe(12)}"
    return f"{message}.{_mac(token, message)}"


def valid(value: str, tokens: Sequence[str], now: float | None = None) -> bool:
    """Whether `value` is an unexpired session signed for one of `tokens`."""
    message, _, mac = value.rpartition(".")
    parts = message.split(".")
    if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit() or not mac:
        return False
    if int(parts[1]) < (time.time() if now is None else now):
        return False
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(_mac(token, message), mac)
    return ok


def cookie_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The console cookie's value from raw ASGI headers, or None."""
    for name, raw in headers:
        if name.lower() != b"cookie":
            continue
        for part in raw.decode("latin-1").split(";"):
            key, _, value = part.strip().partition("=")
            if key == COOKIE and value:
                return value
    return None


def cookie_allows(
    headers: Sequence[tuple[bytes, bytes]], method: str, tokens: Sequence[str]
) -> bool:
    """Whether the request's console cookie authenticates it (writes need WRITE_HEADER too)."""
    value = cookie_from_headers(headers)
    if value is None or not valid(value, tokens):
        return False
    if method.upper() in _SAFE_METHODS:
        return True
    return any(name.lower() == WRITE_HEADER and raw == b"1" for name, raw in headers)
