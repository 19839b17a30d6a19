"""A local HTTP business backend for the gateway tests: it counts requests and can misbehave.

Modes per path (set `backend.mode[path]`): `ok`; `drop` (apply the write, then close the
connection without answering: the request was sent, the outcome is unknown to the client);
`drop_before_apply` (close without applying); `slow` (answer after `slow_seconds`); `hold`
(apply the write, set `backend.held`, then keep the client waiting until `backend.release` is
set, and drop the connection: for killing a worker while its request is in flight); on
`/orders` and `/report`, `dribble` (a 200 whose body comes one byte every 50 ms: each read is
quick, the answer takes hours), `dribble_headers` (a status line, then headers one byte every
50 ms: the headers would take hours) and `endless` (a 200 whose body never ends); on
`/report`, `error` (a 503), `paged` (ten rows and a `next_cursor`) and `counted` (ten rows of a
`total` of 500).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["SPEC", "Backend", "api_call", "gateway_overrides", "running_backend"]

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "utility backend"},
    "paths": {
        "/settings/{key}": {
            "parameters": [
                {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "get": {"operationId": "getSetting", "summary": "read a setting"},
            "put": {
                "operationId": "putSetting",
                "summary": "replace a setting",
                "x-verify-with": "getSetting",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Setting"}}
                    },
                },
            },
        },
        "/secrets/{key}": {
            "parameters": [
                {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "get": {"operationId": "getSecret", "x-effect": "sensitive_read"},
        },
        "/orders": {
            "post": {
                "operationId": "createOrder",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["item", "quantity"],
                                "properties": {
                                    "item": {"type": "string", "minLength": 1},
                                    "quantity": {"type": "integer", "minimum": 1},
                                    "priority": {
                                        "type": "string",
                                        "enum": ["low", "high"],
                                        "default": "low",
                                    },
                                },
                            }
                        }
                    },
                },
            }
        },
        "/jobs": {
            "post": {
                "operationId": "startJob",
                "parameters": [{"name": "kind", "in": "query", "schema": {"type": "string"}}],
            }
        },
        "/report": {
            "get": {
                "operationId": "bigReport",
                "parameters": [
                    {"name": "size", "in": "query", "schema": {"type": "integer", "default": 10}}
                ],
            }
        },
    },
    "components": {
        "schemas": {
            "Setting": {
                "type": "object",
                "required": ["value"],
                "properties": {"value": {"type": "integer"}, "unit": {"type": "string"}},
            }
        }
    },
}


class Backend:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.settings: dict[str, Any] = {}
        self.mode: dict[str, str] = {}
        self.slow_seconds = 2.0
        #: Set when a `dribble_headers` answer stopped: its client went away.
        self.header_dribbles_ended = threading.Event()
        self.js_numbers = False
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return self.requests[(method, path)]


def _handler(backend: Backend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else None

        def _reply(self, status: int, payload: Any, *, bom: bool = False) -> None:
            if backend.js_numbers:
                payload = _js_numbers(payload)
            data = (b"\xef\xbb\xbf" if bom else b"") + json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dribble(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "100000")
            self.end_headers()
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client gave up
                for _ in range(100_000):
                    self.wfile.write(b" ")
                    time.sleep(0.05)

        def _dribble_headers(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client gave up
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                self.wfile.flush()
                for _ in range(100_000):
                    self.wfile.write(b"a")
                    self.wfile.flush()
                    time.sleep(0.05)

        def _endless(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("connection", "close")  # no length: the body ends at the close
            self.end_headers()
            self.close_connection = True
            chunk = b"[" + b"0," * 32_768
            with contextlib.suppress(OSError):
                for _ in range(16_384):  # 1 GiB, unless the client stops reading first
                    self.wfile.write(chunk)

        def _drop(self) -> None:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        def _handle(self, method: str) -> None:
            path = self.path.split("?")[0]
            body = self._body() if method in ("PUT", "POST") else None
            with backend.lock:
                backend.requests[(method, path)] += 1
            mode = backend.mode.get(path, "ok")
            if mode == "drop_before_apply":
                self._drop()
                return
            if mode == "slow":
                time.sleep(backend.slow_seconds)
            if mode == "error" and path == "/report":
                self._reply(503, {"error": "the report service is down"})
                return
            if mode == "dribble_headers" and path in ("/orders", "/report"):
                try:
                    self._dribble_headers()
                finally:
                    backend.header_dribbles_ended.set()
                return
            if mode in ("dribble", "endless") and path in ("/orders", "/report"):
                self._dribble() if mode == "dribble" else self._endless()
                return
            if path.startswith("/settings/"):
                key = path.removeprefix("/settings/")
                if method == "PUT":
                    backend.settings[key] = body
                    if mode == "hold":
                        backend.held.set()
                        backend.release.wait(timeout=60)
                        self._drop()
                        return
                    if mode == "drop":
                        self._drop()
                        return
                    self._reply(200, body)
                elif key in backend.settings:
                    self._reply(200, backend.settings[key])
                else:
                    self._reply(404, {"error": "no such setting"})
            elif path == "/orders":
                if mode == "drop":
                    self._drop()
                    return
                if mode == "garbled":  # applied, but the answer cannot be read
                    data = b'{"order": 1, "err'
                    self.send_response(201)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if body["quantity"] > 10:
                    self._reply(422, {"error": "quantity above the limit"})
                else:
                    self._reply(201, {"order": 1, "error": "this field is business data"})
            elif path == "/jobs":
                self._reply(202, {"job": "j-1", "state": "queued"})
            elif path == "/secrets/db":
                self._reply(200, {"password": "x" * 5000})
            elif path == "/report":
                if mode == "paged":  # the first page of ten, and a cursor to the next
                    self._reply(200, {"rows": ["é" * 10] * 10, "next_cursor": "page-2"})
                    return
                if mode == "counted":  # ten rows of a total of 500
                    self._reply(200, {"items": ["é" * 10] * 10, "total": 500})
                    return
                # `bom`: UTF-8 with a byte order mark, as some servers write JSON.
                self._reply(200, {"rows": ["é" * 100] * 100}, bom=mode == "bom")
            else:
                self._reply(404, {"error": "unknown path"})

        def do_GET(self) -> None:
            self._handle("GET")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_POST(self) -> None:
            self._handle("POST")

    return Handler


def _js_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _js_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_js_numbers(item) for item in value]
    return value


@contextmanager
def running_backend() -> Iterator[Backend]:
    backend = Backend()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(backend))
    server.daemon_threads = True
    backend.server = server
    # A short poll: shutdown() waits up to one poll interval (0.5 s by default) per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield backend
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def gateway_overrides(folder: Path, backend: Backend, **more: Any) -> dict[str, Any]:
    """`runtime_for` settings that point the write tools at `backend`: its spec written to
    `folder/spec.json`, its URL, and `more`."""
    spec = folder / "spec.json"
    spec.write_text(json.dumps(SPEC), encoding="utf-8")
    return {"gateway_spec": spec, "gateway_base_url": backend.url, **more}


def api_call(call_id: str, operation_id: str, **arguments: Any) -> dict[str, Any]:
    """A scripted `call_api` tool call of `operation_id` with `arguments`."""
    body = {"operation_id": operation_id, "arguments": arguments}
    return {"id": call_id, "name": "call_api", "arguments": body}
