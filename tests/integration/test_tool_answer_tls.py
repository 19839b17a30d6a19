"""The headers' time limit holds over TLS too: a server that sends its status line and then its
headers a byte at a time has the connection shut when the time is up, and the thread reading it
wakes at once (a TLS socket is shut down at the socket level, its TLS state left to the reader).

A loopback TLS server with a certificate of a throwaway authority (trustme, as httpx's and
urllib3's own tests make them)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import trustme

from orchestrator.tools.http_answers import read_answer

LIMIT = 1.0


class _DribblingTLSServer:
    """Accepts one connection, reads the request, sends a status line, then a header byte every
    50 ms until the client goes away (`ended` is set then)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(65536)
                tls.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                for _ in range(100_000):
                    tls.sendall(b"a")
                    time.sleep(0.05)
        except OSError:  # the client shut the connection: what the test waits for
            pass
        finally:
            self.ended.set()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server(authority: trustme.CA) -> Iterator[_DribblingTLSServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    running = _DribblingTLSServer(context)
    yield running
    running.close()


def test_headers_dribbled_over_tls_time_out_and_the_connection_is_shut(
    authority: trustme.CA, server: _DribblingTLSServer
) -> None:
    verify = ssl.create_default_context()
    authority.configure_trust(verify)
    raised: list[BaseException] = []

    def call() -> None:
        with httpx.Client(verify=verify, timeout=5) as client:
            request = client.build_request("GET", f"https://127.0.0.1:{server.port}/report")
            try:
                read_answer(client, request, body_seconds=LIMIT)
            except BaseException as exc:  # what the test looks at below
                raised.append(exc)

    started = time.monotonic()
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=LIMIT + 10)
    took = time.monotonic() - started
    # Before the limit on the headers, each byte within the 5 s read timeout kept it reading.
    assert not caller.is_alive(), "still reading the headers"
    assert len(raised) == 1
    assert isinstance(raised[0], httpx.ReadTimeout), raised
    assert "headers did not arrive in time" in str(raised[0])
    assert LIMIT <= took < LIMIT + 2.0
    assert server.ended.wait(timeout=5), "the server still had its connection"
