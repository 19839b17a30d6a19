"""A request uvicorn refuses before the app runs (a 200 KB header, a line that is not HTTP)
gets the API's JSON error envelope, not uvicorn's plain text."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time
from pathlib import Path

from tests.acceptance.fleet import ORCHESTRATOR
from tests.acceptance.test_api_logs import running_api

TOKEN = "wire-errors-token-9f8e7d"


def exchange(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers, body) of the answer to raw `request` bytes.

    The server answers and closes before a too-large request is all sent: the answer is read
    as it comes, while sending, and sending stops at the close."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        pending = memoryview(request)
        while True:
            readable, writable, _ = select.select([conn], [conn] if pending else [], [], 10)
            assert readable or writable, "no answer within 10 s"
            try:
                if readable:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                elif writable:
                    pending = pending[conn.send(pending[:65536]) :]
            except (BrokenPipeError, ConnectionResetError):
                if not readable:
                    pending = memoryview(b"")  # closed for sending: read what it answered
                    continue
                break
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_a_huge_header_and_a_malformed_request_get_the_envelope(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(tmp_path / "home"), "ORCH_API_TOKEN": TOKEN})
    assert subprocess.run([ORCHESTRATOR, "db", "upgrade"], env=env, timeout=60).returncode == 0
    with running_api(tmp_path, env) as port:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
                time.sleep(0.1)
        huge = (
            b"GET /api/v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nX-Big: "
            + b"a" * 200_000
            + b"\r\n\r\n"
        )
        for request in (huge, b"NOT HTTP AT ALL\r\n\r\n"):
            status, headers, body = exchange(port, request)
            assert status.startswith("HTTP/1.1 400"), status
            assert headers["content-type"] == "application/json"
            assert headers["x-content-type-options"] == "nosniff"
            error = json.loads(body)["error"]
            assert error["code"] == "bad_request"
            assert "16 KiB" in error["message"]
            assert TOKEN.encode() not in body
        # A request within the limit is served as before.
        fine = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
        status, _, body = exchange(
            port, fine.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        )
        assert status.startswith("HTTP/1.1 200"), status
    assert TOKEN not in (tmp_path / "api.log").read_text()
