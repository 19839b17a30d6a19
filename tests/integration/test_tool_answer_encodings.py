"""A compressed tool answer is undone within the size cap: a gzip bomb is refused with at most
the cap in memory, and gzip and deflate answers (zlib-wrapped or raw, one or two encodings) read
as httpx read them. A loopback HTTP server sends the bytes as given.

Before, httpx expanded each chunk it read whole before `read_answer` could look at its size: one
64 KiB chunk of a gzip bomb was 64 MiB in memory, whatever the cap."""

from __future__ import annotations

import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from orchestrator.tools.http_answers import AnswerTooLarge, read_answer

#: 64 MiB of zeros, gzipped: about 64 KiB on the wire.
BOMB = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
ROWS = json.dumps({"rows": [{"n": n, "value": n * 0.5} for n in range(20_000)]}).encode()


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


#: path -> (Content-Encoding, body as sent)
ANSWERS = {
    "/bomb": ("gzip", BOMB),
    "/gzip": ("gzip", gzip.compress(ROWS)),
    "/deflate": ("deflate", zlib.compress(ROWS)),
    "/raw-deflate": ("deflate", _raw_deflate(ROWS)),
    "/twice": ("deflate, gzip", gzip.compress(zlib.compress(ROWS))),
    "/plain": ("identity", ROWS),
    "/unknown": ("br", b"as sent"),
    "/corrupt": ("gzip", b"\x1f\x8b\x09" + b"\xff" * 64),  # compression method 9: none such
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        encoding, body = ANSWERS[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _read(base_url: str, path: str, max_bytes: int = 16 * 1024 * 1024) -> bytes:
    with httpx.Client() as client:
        request = client.build_request("GET", base_url + path)
        return read_answer(client, request, body_seconds=10, max_bytes=max_bytes).content


@pytest.mark.parametrize("path", ["/gzip", "/deflate", "/raw-deflate", "/twice", "/plain"])
def test_compressed_answers_read_as_httpx_reads_them(base_url: str, path: str) -> None:
    assert _read(base_url, path) == ROWS
    assert httpx.get(base_url + path).content == ROWS  # the same bytes httpx gives


def test_an_encoding_httpx_does_not_undo_is_left_as_sent(base_url: str) -> None:
    assert _read(base_url, "/unknown") == b"as sent"


def test_a_gzip_bomb_is_refused_without_expanding_it(base_url: str) -> None:
    cap = 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(AnswerTooLarge):
            _read(base_url, "/bomb", max_bytes=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # At most the cap and a raw chunk or two: before, one chunk expanded to 64 MiB.
    assert peak < 4 * cap


def test_an_answer_just_under_the_cap_once_expanded_is_read_and_one_over_is_refused(
    base_url: str,
) -> None:
    assert len(_read(base_url, "/gzip", max_bytes=len(ROWS))) == len(ROWS)
    with pytest.raises(AnswerTooLarge):
        _read(base_url, "/gzip", max_bytes=len(ROWS) - 1)


def test_a_corrupt_stream_is_a_decoding_error_as_in_httpx(base_url: str) -> None:
    with pytest.raises(httpx.DecodingError):
        _read(base_url, "/corrupt")
    with pytest.raises(httpx.DecodingError):
        httpx.get(base_url + "/corrupt")
