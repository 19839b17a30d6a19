"""ORCH_MAX_BODY_BYTES: a request body over the limit is a 413 before it is read.

A declared `Content-Length` over the limit is refused before the application sees the request;
a chunked body (no length) is counted as it arrives and refused at the first chunk that crosses
the limit, so a 200 MiB context never sits in memory, let alone in the store.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit"]


def _too_large(limit: int) -> str:
    return f"the request body is larger than ORCH_MAX_BODY_BYTES ({limit} bytes)"


class BodyLimit:
    """Pure ASGI middleware; the refusal uses the error envelope (`too_large`)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Raised inside the body read: FastAPI's handler answers 413 with the envelope.
                    raise HTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = _too_large(self.max_bytes)
        body = {"error": {"code": "too_large", "message": message, "details": []}}
        response = JSONResponse(body, status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)
