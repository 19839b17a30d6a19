"""The console's browser session: a signed cookie that names an account, never holds its token.

A browser cannot put a bearer token on an `EventSource`, and a token in a page or a URL leaks.
So the console trades a token once (sign-in form or `/console?token=`) for a cookie
`v2.<name>.<expires>.<nonce>.<mac>`: `name` is the account's name (base64url, so a `.` in it
cannot shift the fields) and the MAC is an HMAC-SHA256 over the first four fields, keyed by a
secret derived from that account's stored token hash. The accounts are ORCH_API_TOKEN's (named
`api`, full rights) and those of ORCH_OPERATORS.

The cookie itself is not stored: a restarted API still accepts it; signing out records its
nonce until it expires (`orchestrator.api.signouts`), so a copy is refused too; changing an
account's token (or removing the account) signs its browsers out; a forged name fails the
MAC, because the name is signed and picks the key. With ORCH_CONSOLE_SECRET set, the key also
depends on that secret: the operators file alone (token hashes) is then not enough to sign a
cookie, and changing the secret signs every browser out. The role comes from the accounts file
at each request, never from the cookie. The cookie is HttpOnly and SameSite=Strict; a
cookie-authenticated write must also carry `X-Orch-Console: 1`, a header no cross-site form
can send.

Over HTTPS the cookie is named `__Host-orch_console` (`HTTPS_COOKIE`): a browser keeps a cookie
of that name only when it is Secure, at `Path=/` and without `Domain`, and set over HTTPS, so a
sibling host of the site (wiki.example.com beside orch.example.com) or a page over plain HTTP
cannot set one to pass its own account's session off as the person's (cookie tossing). Over
plain HTTP (loopback development) it keeps the name `orch_console` (`COOKIE`). A request is read
by the name that applies to how it arrived (`cookie_name`); a cookie of the other name is no
session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.operators import Account, Operator, api_account

__all__ = [
    "COOKIE",
    "HTTPS_COOKIE",
    "SESSION_SECONDS",
    "WRITE_HEADER",
    "Revoked",
    "Session",
    "cookie_from_headers",
    "cookie_name",
    "cookie_operator",
    "holder",
    "issue",
    "over_https",
    "sign_in_accounts",
    "signed_session",
    "ticket",
    "ticket_account",
    "write_without_header",
]

#: Whether a session was signed out (`orchestrator.api.signouts.SignOuts.revoked`).
Revoked = Callable[["Session"], bool]

#: The cookie's name over plain HTTP, and over HTTPS (see the module).
COOKIE = "orch_console"
HTTPS_COOKIE = "__Host-orch_console"
SESSION_SECONDS = 12 * 3600
WRITE_HEADER = b"x-orch-console"
_VERSION = "v2"
_TICKET = "t1"
#: How long a sign-in link's confirming page may wait for its click.
TICKET_SECONDS = 300
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_NAME = 128
_MAX_COOKIE = 1024


def sign_in_accounts(api_token: str | None, operators: Sequence[Account]) -> tuple[Account, ...]:
    """Every account a console user may sign in as: ORCH_API_TOKEN's, then ORCH_OPERATORS'.

    Empty means nothing is configured: the API is open, and so is the console."""
    shared = api_account(api_token)
    return ((shared,) if shared else ()) + tuple(operators)


def _mac(account: Account, message: str, secret: str | None) -> str:
    mixed = b"" if secret is None else secret.encode("utf-8") + b"\0"
    key = hashlib.sha256(b"orch-console-session\0" + mixed + account.digest).digest()
    return hmac.new(key, message.encode("ascii"), hashlib.sha256).hexdigest()


def _encode_name(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii").rstrip("=")


def _decode_name(text: str) -> str | None:
    if not text or len(text) > _MAX_NAME * 2:
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def issue(account: Account, now: float | None = None, *, secret: str | None = None) -> str:
    """A new session cookie value for a browser that presented `account`'s token (`secret`:
    ORCH_CONSOLE_SECRET, mixed into the key when set)."""
    expires = int((time.time() if now is None else now) + SESSION_SECONDS)
    name = _encode_name(account.operator.name)
    message = f"{_VERSION}.{name}.{expires}.{secrets.token_urlsafe(12)}"
    return f"{message}.{_mac(account, message, secret)}"


def holder(
    value: str,
    accounts: Sequence[Account],
    now: float | None = None,
    *,
    secret: str | None = None,
    revoked: Revoked | None = None,
) -> Operator | None:
    """The account an unexpired, correctly signed session `value` stands for, or None; None
    too for a session signed out (`revoked(session)`, see `orchestrator.api.signouts`)."""
    session = signed_session(value, accounts, now, secret=secret)
    if session is None or (revoked is not None and revoked(session)):
        return None
    return session.operator


def ticket(account: Account, now: float | None = None, *, secret: str | None = None) -> str:
    """A short-lived proof that `account`'s token was presented (a `?token=` link opened from
    another site), for the confirming page's form to post: not the token, and no cookie (its
    first field keeps the two apart under one key)."""
    expires = int((time.time() if now is None else now) + TICKET_SECONDS)
    message = f"{_TICKET}.{_encode_name(account.operator.name)}.{expires}"
    return f"{message}.{_mac(account, message, secret)}"


def ticket_account(
    value: str, accounts: Sequence[Account], now: float | None = None, *, secret: str | None = None
) -> Account | None:
    """The account an unexpired, correctly signed `ticket` stands for, or None."""
    found = _signed(value, accounts, _TICKET, 3, now, secret)
    return found[0] if found is not None else None


@dataclass(frozen=True)
class Session:
    """A valid session cookie's account, its nonce and when it expires (epoch seconds)."""

    operator: Operator
    nonce: str
    expires: int


def signed_session(
    value: str,
    accounts: Sequence[Account],
    now: float | None = None,
    *,
    secret: str | None = None,
) -> Session | None:
    """The session an unexpired, correctly signed cookie `value` is, whether signed out or not
    (sign-out records its nonce): None for anything else."""
    found = _signed(value, accounts, _VERSION, 4, now, secret)
    if found is None:
        return None
    account, parts = found
    return Session(account.operator, parts[3], int(parts[2]))


def _signed(
    value: str,
    accounts: Sequence[Account],
    tag: str,
    fields: int,
    now: float | None,
    secret: str | None,
) -> tuple[Account, list[str]] | None:
    """The account and the fields of `value` (`tag.NAME.EXPIRES[...].MAC`, `fields` before
    the MAC) when it is unexpired and signed with that account's key; None for anything else
    (a cookie offered as a ticket, or a ticket as a cookie, has another tag)."""
    if len(value) > _MAX_COOKIE or not value.isascii():
        return None
    message, _, mac = value.rpartition(".")
    parts = message.split(".")
    if len(parts) != fields or parts[0] != tag or not mac:
        return None
    if not parts[2].isdigit() or len(parts[2]) > 12:
        return None
    name = _decode_name(parts[1])
    if name is None or int(parts[2]) < (time.time() if now is None else now):
        return None
    account = next((a for a in accounts if a.operator.name == name), None)
    if account is None or not hmac.compare_digest(_mac(account, message, secret), mac):
        return None
    return account, parts


def over_https(scope: Mapping[str, Any]) -> bool:
    """Whether the browser reached us over HTTPS: directly, or through a proxy that ends TLS
    and says so (`X-Forwarded-Proto: https`, or `Forwarded: proto=https`). uvicorn trusts
    those headers only from 127.0.0.1, so behind a proxy in another container the scheme
    reads `http`, and the cookie, without `Secure`, would go out on any plain-HTTP request to
    the host (a typed URL, a redirect a network attacker injects). Believing the header here
    can only make the cookie stricter: a browser keeps no Secure cookie set over plain HTTP,
    and sends none over it."""
    if scope.get("scheme") in ("https", "wss"):
        return True
    proto = forwarded = ""
    for name, raw in scope.get("headers", ()):
        if name.lower() == b"x-forwarded-proto" and not proto:
            proto = raw.decode("latin-1").split(",")[0].strip().lower()
        elif name.lower() == b"forwarded" and not forwarded:
            forwarded = raw.decode("latin-1").split(",")[0].lower()
    return proto == "https" or "proto=https" in forwarded.replace(" ", "").replace('"', "")


def cookie_name(scope: Mapping[str, Any]) -> str:
    """The name the console cookie has for a request that arrived as `scope` says."""
    return HTTPS_COOKIE if over_https(scope) else COOKIE


def cookie_from_headers(headers: Iterable[tuple[bytes, bytes]], cookie: str) -> str | None:
    """The value of the console cookie named `cookie` (`cookie_name`) from raw ASGI headers,
    or None; None too when the browser sends two of that name: ours is host-only at `/`, so
    the other was set by a sibling host of the site (`Domain=` the parent, a longer `Path`,
    sent first) to pass its own account's session off as the person's (cookie tossing), and
    which one is ours cannot be told (a `__Host-` cookie no sibling can set)."""
    found: str | None = None
    for name, raw in headers:
        if name.lower() != b"cookie":
            continue
        for part in raw.decode("latin-1").split(";"):
            key, _, value = part.strip().partition("=")
            if key == cookie and value:
                if found is not None:
                    return None
                found = value
    return found


def cookie_operator(
    headers: Sequence[tuple[bytes, bytes]],
    method: str,
    accounts: Sequence[Account],
    *,
    cookie: str,
    secret: str | None = None,
    revoked: Revoked | None = None,
) -> Operator | None:
    """The account the request's console cookie (named `cookie`) stands for, or None (a write
    without WRITE_HEADER is None too: it could come from a cross-site form)."""
    value = cookie_from_headers(headers, cookie)
    if value is None:
        return None
    operator = holder(value, accounts, secret=secret, revoked=revoked)
    if operator is None:
        return None
    if method.upper() in _SAFE_METHODS:
        return operator
    if any(name.lower() == WRITE_HEADER and raw == b"1" for name, raw in headers):
        return operator
    return None


def write_without_header(
    headers: Sequence[tuple[bytes, bytes]],
    method: str,
    accounts: Sequence[Account],
    *,
    cookie: str,
    secret: str | None = None,
    revoked: Revoked | None = None,
) -> bool:
    """Whether the request is a write with a valid console cookie but without WRITE_HEADER:
    refused all the same, and said so (a script replaying the console's requests would
    otherwise read "wrong bearer token" and look for a token it never needed)."""
    if method.upper() in _SAFE_METHODS:
        return False
    value = cookie_from_headers(headers, cookie)
    return value is not None and holder(value, accounts, secret=secret, revoked=revoked) is not None
