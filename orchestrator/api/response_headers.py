"""Headers every answer of the API carries: its JSON is data, never a page, and never kept.

An answer repeats what it was sent or what a model wrote (an id in a `404`'s message, a plan's
titles): `X-Content-Type-Options: nosniff` keeps any browser from reading such JSON as HTML on
the console's origin, where it could act with the console's cookie. The answers hold task
contexts, plans and evidence: `Cache-Control: no-store` keeps them out of a browser's or a
proxy's cache (an answer that says otherwise, a stream's `no-cache`, keeps its own). The
console's pages set their own stricter headers (`api.console`).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ResponseHeaders"]

_DEFAULTS = (("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store"))


class ResponseHeaders:
    """Pure ASGI middleware: adds each of `_DEFAULTS` an answer does not set itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _DEFAULTS:
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)
