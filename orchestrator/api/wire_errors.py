"""Requests uvicorn refuses before the app runs, answered with the API's error envelope.

A request that is not valid HTTP, or whose header block outgrows h11's buffer (a 200 KB
header), never reaches the application: uvicorn's h11 protocol answers it itself, with
a plain-text `400 Invalid HTTP request received.`, which a client of a JSON API cannot
read as the API's errors. `EnvelopeH11` is that protocol with the same answer as JSON:
`400 bad_request` in the envelope, with the headers every answer of the API carries
(`api.response_headers`). `orchestrator api` serves with it.

The limit itself stays h11's: a header block of up to 16 KiB is always read; a larger one
only when it arrives in one piece (up to 256 KiB), so clients must stay under 16 KiB.
`send_400_response` is uvicorn's own method, not a documented hook:
tests/acceptance/test_api_wire_errors.py fails if an upgrade stops calling it.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BAD_REQUEST", "EnvelopeH11"]

#: What the refusal says: the request itself, not the app, was the problem.
BAD_REQUEST = "the request is not valid HTTP, or its headers are too large (keep them under 16 KiB)"
_BODY = json.dumps(
    {"error": {"code": "bad_request", "message": BAD_REQUEST, "details": []}}
).encode("ascii")


class EnvelopeH11(H11Protocol):
    """uvicorn's h11 protocol whose refusal of a malformed request is the error envelope."""

    def send_400_response(self, msg: str) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(_BODY)).encode("ascii")),
            (b"x-content-type-options", b"nosniff"),
            (b"cache-control", b"no-store"),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=_BODY),
            h11.EndOfMessage(),
        ):
            output = self.conn.send(event)
            if output:
                self.transport.write(output)
        self.transport.close()
