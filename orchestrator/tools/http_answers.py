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

The headers have a limit of their own, from the moment the request starts to leave: a server
that sends its status line and then its headers a byte at a time, each within the read timeout,
held the call up to h11's 16 KiB header limit times the read timeout (hours), and its thread
with it. When the headers have not all come by then, the connection's socket is shut down (the
thread reading it wakes at once) and the call ends as an httpx timeout.

A compressed answer (`Content-Encoding: gzip` or `deflate`, as httpx undoes them) is undone
here, a bounded step at a time: httpx would expand each chunk it reads whole, and one chunk of
64 KiB of a gzip bomb is 64 MiB before any cap could look at it. Here no step gives more than the
room left under the cap (zlib's `max_length`), so a bomb is refused with at most the cap in
memory. Other encodings are left as they are, as httpx leaves them. The model client bounds its
answers with the same `BoundedDecoding` (`orchestrator.agent.model_http`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["MAX_ANSWER_BYTES", "Answer", "AnswerTooLarge", "BoundedDecoding", "read_answer"]

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
    """Send `request`, take its headers within `body_seconds` of the request starting to
    leave, and read its whole body within `body_seconds` of the headers.

    Raises what `client.send` raises, `httpx.ReadTimeout` past either time, and
    `AnswerTooLarge`; the connection is closed whatever happens.
    """
    watch = _HeaderWatch(body_seconds, request.extensions.get("trace"))
    request.extensions["trace"] = watch.trace
    try:
        response = client.send(request, stream=True)
    except httpx.TransportError as exc:
        if watch.expired:
            raise httpx.ReadTimeout(
                "the answer's headers did not arrive in time", request=request
            ) from exc
        raise
    finally:
        watch.done()
    deadline = time.monotonic() + body_seconds
    try:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerTooLarge(max_bytes, response.status_code)
        decoding = BoundedDecoding(
            response.headers.get_list("content-encoding", split_commas=True),
            max_bytes,
            response.status_code,
        )
        chunks: list[bytes] = []
        size = 0
        for raw in response.iter_raw():
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the answer's body did not arrive in time", request=request)
            pieces = decoding.feed(raw, max_bytes - size)
            size += sum(len(piece) for piece in pieces)
            chunks.extend(pieces)
        chunks.extend(decoding.finish(max_bytes - size))
        return Answer(response.status_code, response.headers, b"".join(chunks))
    except zlib.error as exc:
        raise httpx.DecodingError(str(exc), request=request) from exc
    finally:
        response.close()


class _HeaderWatch:
    """Shuts the connection's socket down when the answer's headers are late.

    httpcore's trace events tell when the connection is made (its network stream, whose socket
    is kept), when the request starts to leave (the clock starts) and when the headers are in
    (the watch ends). A socket shut down wakes the thread blocked reading it (closing it would
    not); `socket.socket.shutdown` is called as such so that a TLS socket is shut down at the
    socket level, as `ssl.SSLSocket.shutdown` would also drop its TLS state under the reader.
    Chained to any trace the request already had (the gateway's `_Wire`).
    """

    def __init__(self, seconds: float, chained: Callable[[str, dict[str, Any]], Any] | None):
        self.seconds = seconds
        self.chained = chained
        self.expired = False
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._ended = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            stream = info.get("return_value")
            found = stream.get_extra_info("socket") if stream is not None else None
            with self._lock:
                self._socket = found if isinstance(found, socket.socket) else self._socket
        elif event.endswith(".send_request_headers.started"):
            with self._lock:
                if self._timer is None and not self._ended:
                    self._timer = threading.Timer(self.seconds, self._expire)
                    self._timer.daemon = True
                    self._timer.start()
        elif event.endswith(".receive_response_headers.complete"):
            self.done()
        if self.chained is not None:
            self.chained(event, info)

    def done(self) -> None:
        """The headers are in, or the send ended otherwise: nothing is shut down after this."""
        with self._lock:
            self._ended = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            if self._ended:
                return
            self.expired = True
            sock = self._socket
        if sock is not None:
            with suppress(OSError):  # closed meanwhile: nothing is left to wake
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class BoundedDecoding:
    """An answer's `Content-Encoding` (the header's values) undone, the last applied first as
    httpx does, each step asked for at most the room left under the cap plus one byte: a step
    that gives that byte more (zlib stops at `max_length`) makes the answer too large
    (`AnswerTooLarge`), refused unexpanded. A corrupt stream raises `zlib.error`. Without gzip
    or deflate, `feed` only checks each chunk against the room left.

    The decoded bytes come in pieces of at most `STEP_BYTES`: zlib builds its output in blocks
    joined at the end, so one step of the whole room would hold twice the cap for a moment."""

    def __init__(self, encodings: Sequence[str], max_bytes: int, status_code: int) -> None:
        self.max_bytes = max_bytes
        self.status_code = status_code
        names = [name.strip().lower() for name in encodings]
        self.steps = [_Step(name) for name in reversed(names) if name in ("gzip", "deflate")]

    def feed(self, data: bytes, room: int) -> list[bytes]:
        """`data` decoded, in pieces; `AnswerTooLarge` if they come to more than `room`."""
        pieces = [data]
        for step in self.steps:
            pieces = self._through(step, pieces, room, last=False)
        return self._checked(pieces, room)

    def finish(self, room: int) -> list[bytes]:
        """What the steps still hold once the body has all come."""
        pieces: list[bytes] = []
        for step in self.steps:
            pieces = self._through(step, pieces, room, last=True)
        return self._checked(pieces, room)

    def _through(self, step: _Step, pieces: list[bytes], room: int, *, last: bool) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        for piece in pieces:
            for part in step.decompress(piece, room + 1 - size):
                out.append(part)
                size += len(part)
            self._checked_size(size, room)
        if last:
            out.append(step.flush(room + 1 - size))
        return out

    def _checked(self, pieces: list[bytes], room: int) -> list[bytes]:
        self._checked_size(sum(len(piece) for piece in pieces), room)
        return pieces

    def _checked_size(self, size: int, room: int) -> None:
        if size > room:
            raise AnswerTooLarge(self.max_bytes, self.status_code)


#: The most one zlib call gives at once (see `BoundedDecoding`).
STEP_BYTES = 1024 * 1024


class _Step:
    """One encoding undone by zlib, as httpx does it: gzip with its header; deflate
    zlib-wrapped, or raw when its first chunk says it is."""

    def __init__(self, name: str) -> None:
        self.first = name == "deflate"  # a first chunk that fails may be raw deflate
        self.zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if name == "gzip" else zlib.MAX_WBITS)

    def decompress(self, data: bytes, limit: int) -> list[bytes]:
        """`data` undone, at most `limit` (at least 1) bytes of it, a step at a time."""
        first, self.first = self.first, False
        try:
            part = self.zlib.decompress(data, min(limit, STEP_BYTES))
        except zlib.error:
            if not first:
                raise
            self.zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            part = self.zlib.decompress(data, min(limit, STEP_BYTES))
        parts = [part]
        size = len(part)
        while self.zlib.unconsumed_tail and size < limit:
            part = self.zlib.decompress(self.zlib.unconsumed_tail, min(limit - size, STEP_BYTES))
            parts.append(part)
            size += len(part)
        return parts

    def flush(self, limit: int) -> bytes:
        # Nothing is left unconsumed here (`decompress` went on until `limit`, which is too
        # large): what flush gives is what zlib held back, a window at most.
        return self.zlib.flush(max(1, limit))
