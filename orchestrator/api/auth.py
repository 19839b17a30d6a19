"""Bearer tokens: ORCH_API_TOKEN for public routes, AGENT_INTERNAL_TOKEN for the internal bridge.

`BearerTokens` is a pure ASGI middleware that decides on the path alone, before FastAPI reads
or parses a body: a request without the right token is a 401 `unauthorized` whatever it sends
(malformed JSON included), and a refused body is never read. The route dependencies below check
the same again, so a router mounted some other way is not left open.

Tokens are compared in constant time (digests of equal length, so not even the length leaks) and
never appear in a log line or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Iterable

from fastapi import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.api.console_session import accepted_tokens, cookie_allows
from orchestrator.errors import Unauthorized
from orchestrator.settings import Settings

__all__ = ["BearerTokens", "require_api_token", "require_internal_token"]

_WRONG = "missing or wrong bearer token"
_CLOSED = "the internal bridge is closed: AGENT_INTERNAL_TOKEN is not set"


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The raw Authorization header (empty when absent); the first one if repeated."""
    for name, value in headers:
        if name.lower() == b"authorization":
            return value
    return b""


def bearer_matches(header: bytes, expected: str) -> bool:
    """Whether a raw Authorization header carries `expected` as its bearer token.

    Bytes throughout: a non-ASCII token is compared as the UTF-8 the client sent.
    """
    scheme, _, presented = header.partition(b" ")
    # compare_digest of two SHA-256 digests: constant time for any content and any length.
    matches = hmac.compare_digest(
        hashlib.sha256(presented.strip()).digest(),
        hashlib.sha256(expected.encode("utf-8", "surrogateescape")).digest(),
    )
    return scheme.lower() == b"bearer" and matches


def _check_bearer(request: Request, expected: str) -> None:
    if not bearer_matches(_authorization(request.scope.get("headers", ())), expected):
        raise Unauthorized(_WRONG)


def require_api_token(request: Request) -> None:
    """Public routes: a bearer token or the console cookie, when ORCH_API_TOKEN is set."""
    settings = _settings(request)
    expected = settings.api_token
    if not expected:
        return
    headers = request.scope.get("headers", ())
    if cookie_allows(headers, request.method, accepted_tokens(settings)):
        return
    _check_bearer(request, expected)


def require_internal_token(request: Request) -> None:
    """The internal tool bridge: always needs AGENT_INTERNAL_TOKEN; unset means closed."""
    expected = _settings(request).agent_internal_token
    if not expected:
        raise Unauthorized(_CLOSED)
    _check_bearer(request, expected)


class BearerTokens:
    """Token check on the path prefix, ahead of routing and body parsing.

    Under `internal_prefix` AGENT_INTERNAL_TOKEN is always required (unset closes the bridge);
    everywhere else, `/openapi.json` and `/docs` included, ORCH_API_TOKEN when it is set, or
    the console's session cookie. `open_paths` (the health check) and paths under
    `open_prefixes` (the console's pages, which do their own sign-in) need no token.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        internal_prefix: str,
        open_paths: Collection[str] = (),
        open_prefixes: Collection[str] = (),
    ) -> None:
        self.app = app
        self.api_token = settings.api_token or None
        self.internal_token = settings.agent_internal_token or None
        self.internal_prefix = internal_prefix.rstrip("/")
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = tuple(prefix.rstrip("/") for prefix in open_prefixes)
        self.cookie_tokens = accepted_tokens(settings)

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused, or None when it may go on."""
        path: str = scope.get("path", "")
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        internal = path == self.internal_prefix or path.startswith(self.internal_prefix + "/")
        if internal:
            expected = self.internal_token
            if expected is None:
                return _CLOSED
        elif path in self.open_paths or any(
            path == prefix or path.startswith(prefix + "/") for prefix in self.open_prefixes
        ):
            return None
        else:
            expected = self.api_token
            if expected is None:
                return None
            headers = scope.get("headers", ())
            if cookie_allows(headers, scope.get("method", "GET"), self.cookie_tokens):
                return None
        header = _authorization(scope.get("headers", ()))
        return None if bearer_matches(header, expected) else _WRONG

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = JSONResponse(
            Unauthorized(refusal).to_dict(),
            status_code=Unauthorized.http_status,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)
