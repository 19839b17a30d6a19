"""The open API's guard: without any token, only this machine's own pages and programs.

With neither ORCH_API_TOKEN nor ORCH_OPERATORS set the API trusts every caller as an approver,
and `orchestrator api` then listens on loopback only. Loopback alone does not keep other sites
out: a page the operator's browser opens elsewhere can post a form to `127.0.0.1:8000` (a
bodyless cancel goes through; nothing tells it from the console's own request), or re-bind its
own host name to 127.0.0.1 (DNS rebinding) and then read and approve as a same-origin page.
So, on an open API only:

- a request that reached a loopback socket must name a loopback host (`localhost`,
  `127.0.0.1`, `[::1]`) in its `Host` header: a re-bound name is refused;
- a write a browser sent from a page of another origin (an `Origin` header that is neither the
  API's own nor one of ORCH_CORS_ORIGINS) is refused; programs such as curl send no `Origin`.

Both are `403 forbidden` with the envelope, before routing. With a token set, the token (or
the console's cookie with its `X-Orch-Console` header) is what keeps other sites out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["OpenGuard", "is_loopback_host"]

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WRONG_HOST = (
    "this API has no token (ORCH_API_TOKEN or ORCH_OPERATORS), so on loopback it answers only "
    "requests addressed to localhost, 127.0.0.1 or [::1]; set a token to use another name"
)
_OTHER_ORIGIN = (
    "a write from a page of another origin is refused: this API has no token "
    "(ORCH_API_TOKEN or ORCH_OPERATORS) that would tell its console from another site; "
    "list a front end's origin in ORCH_CORS_ORIGINS, or set a token"
)


def is_loopback_host(host: str) -> bool:
    """Whether a host name (no port) is `localhost` or a loopback address."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True  # RFC 6761: *.localhost resolves to loopback, never to the network
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name of a `Host` header's value, without its port (`[::1]:8000` gives `[::1]`)."""
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class OpenGuard:
    """Pure ASGI middleware for an API without tokens (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, cors_origins: Collection[str] = ()) -> None:
        self.app = app
        self.cors_origins = frozenset(origin.lower() for origin in cors_origins)

    def _refusal(self, scope: Scope) -> str | None:
        headers = {name.lower(): raw for name, raw in scope.get("headers", ())}
        host = headers.get(b"host", b"").decode("latin-1").strip()
        server = scope.get("server") or ("", 0)
        if host and is_loopback_host(str(server[0])) and not is_loopback_host(_host_name(host)):
            return _WRONG_HOST
        origin = headers.get(b"origin")
        if origin is None or scope.get("method", "GET").upper() in _SAFE_METHODS:
            return None
        sent = origin.decode("latin-1").strip().lower().rstrip("/")
        own = f"{scope.get('scheme', 'http')}://{host}".lower()
        return None if sent == own or sent in self.cors_origins else _OTHER_ORIGIN

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        body = {"error": {"code": "forbidden", "message": refusal, "details": []}}
        await JSONResponse(body, status_code=403)(scope, receive, send)
