"""The model client's HTTP: each answer read within the call's timeout and a size cap.

httpx applies a timeout per phase (the connect, the write, each read), so a server or a proxy
that sends its answer a few bytes at a time, each gap within the timeout, held a model call open
for ever; and an answer was read whole into memory whatever its size, so one bad answer could
take every round of a threads-pool process down with it. The openai client reads the body
inside httpx (its `read` of a 2xx, or of an error status's body), so the bound sits there: two
event hooks of the client's own httpx client (what `openai.DefaultHttpxClient` builds, with the
openai client's connection limits and the environment's proxies) wrap every answer's body.

- Time: the request's timeout (LLM_TIMEOUT_SECONDS) counts from the send, the pool wait and the
  connect included, to the last byte. It is looked at as each chunk arrives: past it the body is
  given up as an `httpx2.ReadTimeout` (to the openai client, the server timed out) and the
  connection closed, at most one read timeout late. The round does not wait for that: it stops
  waiting at the timeout itself (`openai_model`).
- Size: `MAX_MODEL_ANSWER_BYTES` of the body as decoded. A declared Content-Length past it is
  refused before anything is read; otherwise the body is counted as it comes and refused at the
  cap (`AnswerTooLarge`, with at most about the cap in memory). gzip and deflate are undone here
  a bounded step at a time (`tools.http_answers.BoundedDecoding`, as tool answers are) rather
  than by httpx, which expands each chunk whole (64 KiB of a gzip bomb is 64 MiB); requests ask
  for those two encodings only, so no other one (br, zstd) arrives undone by the cap.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import httpx2
import openai

from orchestrator.tools.http_answers import AnswerTooLarge, BoundedDecoding

__all__ = ["MAX_MODEL_ANSWER_BYTES", "AnswerTooLarge", "CorruptAnswer", "bounded_http_client"]

#: The largest model answer read (decoded). A completion is bounded by LLM_MAX_OUTPUT_TOKENS:
#: 100,000 tokens of tool-call JSON, escaped, are a few MiB; 16 MiB leaves room for any real
#: answer and caps what 200 rounds of one process can hold at once. A constant, not a setting:
#: no honest answer comes near it, so there is nothing for an operator to tune.
MAX_MODEL_ANSWER_BYTES = 16 * 1024 * 1024
#: What a request accepts: the encodings undone here within the cap, and nothing else.
_ACCEPTED_ENCODINGS = "gzip, deflate"
#: Where the request hook notes when the request was sent (an extension httpcore ignores).
_SENT = "orchestrator.sent"


class CorruptAnswer(Exception):
    """The answer's body is not what its Content-Encoding says (a corrupt gzip). Not an httpx
    error: the openai client would call that a connection error, and the server did answer."""


def bounded_http_client() -> httpx2.Client:
    """The httpx client for an `openai.OpenAI`: every answer bounded in time and size."""
    return openai.DefaultHttpxClient(event_hooks={"request": [_sent], "response": [_bounded]})


def _sent(request: httpx2.Request) -> None:
    # A redirect's request carries the first one's extensions: the time counts from the first.
    request.extensions.setdefault(_SENT, time.monotonic())
    request.headers["Accept-Encoding"] = _ACCEPTED_ENCODINGS


def _bounded(response: httpx2.Response) -> None:
    """Refuse an answer that says it is too large; read any other through `_BoundedBody`."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_MODEL_ANSWER_BYTES:
        raise AnswerTooLarge(MAX_MODEL_ANSWER_BYTES, response.status_code)  # httpx closes it
    request = response.request
    timeout = request.extensions.get("timeout", {}).get("read")
    sent = request.extensions.get(_SENT, time.monotonic())
    deadline = sent + timeout if timeout is not None else float("inf")
    encodings = response.headers.get_list("content-encoding", split_commas=True)
    decoding = BoundedDecoding(encodings, MAX_MODEL_ANSWER_BYTES, response.status_code)
    if decoding.steps:
        # Undone in `_BoundedBody`: httpx must not undo them a second time.
        del response.headers["content-encoding"]
    assert isinstance(response.stream, httpx2.SyncByteStream)
    response.stream = _BoundedBody(response.stream, request, deadline, decoding)


class _BoundedBody(httpx2.SyncByteStream):
    """The body as it arrives, decoded, until the deadline or the cap; closed on any failure
    (the openai client reads an error status's body without closing it when that fails)."""

    def __init__(
        self,
        raw: httpx2.SyncByteStream,
        request: httpx2.Request,
        deadline: float,
        decoding: BoundedDecoding,
    ) -> None:
        self._raw = raw
        self._request = request
        self._deadline = deadline
        self._decoding = decoding

    def __iter__(self) -> Iterator[bytes]:
        room = self._decoding.max_bytes
        try:
            for raw in self._raw:
                if time.monotonic() > self._deadline:
                    raise httpx2.ReadTimeout(
                        "the answer did not arrive within the timeout", request=self._request
                    )
                for piece in self._decoding.feed(raw, room):
                    room -= len(piece)
                    if piece:
                        yield piece
            for piece in self._decoding.finish(room):
                if piece:
                    yield piece
        except zlib.error as exc:
            self.close()
            raise CorruptAnswer(str(exc)) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._raw.close()
