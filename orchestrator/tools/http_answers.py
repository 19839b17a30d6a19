"""A tool's HTTP answer, read within a size cap, its body within a time limit of its own.

httpx's timeout bounds each phase of a request (the connect, the write, each read), not the
body as a whole: a server that sends its answer a few bytes at a time, each within the read
timeout, held a query or a `call_api` past its `timeout_seconds` until the host gave the call up
(ORCH_TOOL_TIMEOUT_SECONDS), and the thread left behind went on reading an endless answer into
memory. Here the body is read in chunks as they arrive: past `max_bytes` it is refused
(`AnswerTooLarge`, the declared Content-Length checked first), and once `body_seconds` have
passed since the headers it is given up as an httpx timeout. The time is checked as each chunk
arrives, so the body ends at most one read timeout past its limit. The limit starts at the
headers, not at the send, so a gateway's connect retries do not eat into it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["MAX_ANSWER_BYTES", "Answer", "AnswerTooLarge", "read_answer"]

#: The largest answer a tool reads (after decompression). The host keeps at most 1 MiB of a
#: result (`tools.results.MAX_RESULT_BYTES`); a larger answer is cut there, a far larger one
#: is refused here before it is held in memory.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class AnswerTooLarge(Exception):
    """The answer is larger than the cap: nothing of it is used."""

    def __init__(self, max_bytes: int, status_code: int) -> None:
        super().__init__(f"the answer is larger than {max_bytes // (1024 * 1024)} MiB")
        self.max_bytes = max_bytes
        self.status_code = status_code


@dataclass(frozen=True)
class Answer:
    """An answer read whole: its status, headers and body bytes."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON, its encoding detected as httpx's `Response.json()` did (UTF-8,
        with or without a byte order mark, UTF-16 or UTF-32)."""
        return json.loads(self.content)


def read_answer(
    client: httpx.Client,
    request: httpx.Request,
    *,
    body_seconds: float,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> Answer:
    """Send `request` and read its whole body within `body_seconds` of its headers.

    Raises what `client.send` raises, `httpx.ReadTimeout` past the time, and `AnswerTooLarge`;
    the connection is closed whatever happens.
    """
    response = client.send(request, stream=True)
    deadline = time.monotonic() + body_seconds
    try:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerTooLarge(max_bytes, response.status_code)
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise AnswerTooLarge(max_bytes, response.status_code)
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the answer's body did not arrive in time", request=request)
            chunks.append(chunk)
        return Answer(response.status_code, response.headers, b"".join(chunks))
    finally:
        response.close()
