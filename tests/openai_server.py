"""A real OpenAI-compatible chat-completions server on loopback, for the tests of model clients.

It plays a queue of scripted answers, records every request body, reports token usage, can
answer 429/5xx with `Retry-After`, and refuses (HTTP 400) what strict servers (DeepSeek, vLLM,
Qwen) refuse: an assistant tool call without exactly one tool message answering it, in order,
before any other message; a tool message out of place; an empty `tool_calls` list; a call not in
the `{"id", "type": "function", "function": {"name", "arguments": text}}` form.

    with OpenAIServer() as server:
        server.reply(tool_calls=[call("c1", "read_task_context", {})], usage=(120, 8))
        server.fail(429, retry_after=0.1)
        server.reply(content="done")
        ... ORCH_MODEL=openai:test-model LLM_BASE_URL=server.base_url ...
        server.requests  # every body received, the refused ones too

When the queue is empty it answers a final message (`content="done"`), so a round ends; or,
after `converse(replies)`, each conversation gets `replies` in order (the Nth reply to a request
whose history holds N-1 assistant messages), so many rounds can run at once, each its own script
(`converse(other, mentioning="(probe)")`: the conversations whose user messages say so).
`OpenAIServer(delay_s=2)` answers every turn after at least 2 s, like a slow model; a thread per
connection and a deep listen backlog let hundreds of clients wait on it at once.

Answers that misbehave on the wire: `reply(stream=True)` sends the reply as an event stream
(unasked, as some gateways do), `dribble()` sends a completion a byte at a time (each gap
well within any read timeout), `oversize(size)` one padded with whitespace to `size` bytes
(chunked, with its Content-Length, or gzipped: a compression bomb), `reply(gzip=True)` a normal
one gzipped. `server.dropped` is set when the client closed the connection while such an
answer was still going out. `OpenAIServer(lm_studio=True)` answers a POST to any other path
than /v1/chat/completions as LM Studio does: a 200 whose body is an error object.
`OpenAIServer(mistral=True)` refuses (400) a history whose tool-call ids are not 9 letters and
digits, as Mistral's chat template does (vLLM with `--tokenizer-mode mistral`).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.agent.script_refs import resolve_refs

__all__ = [
    "Dribble",
    "Failure",
    "Garbled",
    "OpenAIServer",
    "Oversized",
    "Reply",
    "call",
    "mistral_problem",
    "replies",
    "strict_problem",
]


def call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """One tool call of a reply; a string is sent as the arguments text as it is (malformed)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def replies(turns: list[dict[str, Any]]) -> list[Reply]:
    """A scripted model's turns (`{"tool_calls": [{"id", "name", "arguments"}]}`) as replies."""
    return [
        Reply(
            content=turn.get("content"),
            tool_calls=[
                call(c["id"], c["name"], c["arguments"]) for c in turn.get("tool_calls") or []
            ],
            delay_s=float(turn.get("delay_s", 0.0)),
        )
        for turn in turns
    ]


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None
    #: The thinking under vLLM's newer name (`reasoning`), as vLLM 0.10+ and OpenRouter send it.
    reasoning: str | None = None
    usage: tuple[int, int] | None = None
    delay_s: float = 0.0
    #: As the server says it ("length": cut at max_tokens); None = "tool_calls" or "stop".
    finish_reason: str | None = None
    #: Sent with `Content-Encoding: gzip`.
    gzip: bool = False
    #: The call in the shape before tool calls (`message.function_call`: `{name, arguments}`),
    #: with `finish_reason` `function_call`, as older gateways and self-hosted servers send it.
    function_call: dict[str, Any] | None = None
    #: Sent as an event stream (`text/event-stream`, `chat.completion.chunk` deltas, then
    #: `[DONE]`) whatever the request asked, as some gateways do.
    stream: bool = False


@dataclass
class Failure:
    status: int
    retry_after: float | None = None
    message: str = "scripted failure"
    #: The error's `param` and `code`, as OpenAI names the parameter a 400 is about.
    param: str | None = None
    code: str | None = None


@dataclass
class Garbled:
    """A 200 whose body is not a completion (a proxy's error page, a cut-off body)."""

    body: str = "<html><body>502 Bad Gateway</body></html>"
    content_type: str = "text/html"
    #: Sent as `Content-Encoding` when set (a body that is not what it says: a corrupt gzip).
    encoding: str | None = None


@dataclass
class Dribble:
    """A completion ("done") sent a byte every `interval_s` under its Content-Length (a proxy
    trickling the answer); `status` other than 200 sends it as an error's body."""

    interval_s: float = 0.05
    status: int = 200


@dataclass
class Oversized:
    """A completion ("padded") after whitespace (still valid JSON) to `size` bytes in all: sent
    chunked with no length, with its Content-Length if `declared`, gzip-encoded if `gzip`."""

    size: int
    declared: bool = False
    gzip: bool = False


#: What the script can hold: an answer, or one computed from the request.
Answer = Reply | Failure | Garbled | Dribble | Oversized


@dataclass
class Request:
    body: dict[str, Any]
    refused: str | None  # why the strict check refused it, or None
    answered: int  # the HTTP status sent back


class OpenAIServer:
    """Serves `POST /v1/chat/completions` on 127.0.0.1 on a free port."""

    def __init__(
        self,
        model: str = "test-model",
        *,
        delay_s: float = 0.0,
        lm_studio: bool = False,
        mistral: bool = False,
    ) -> None:
        self.model = model
        #: Refuse a history with a tool-call id Mistral's template refuses (`mistral_problem`).
        self.mistral = mistral
        #: A POST to another path is answered 200 `{"error": "Unexpected endpoint or method..."}`
        #: (LM Studio's answer to a base URL without its /v1), not 404.
        self.lm_studio = lm_studio
        self.delay_s = delay_s  # the least time before any answer (200) goes out
        self.script: deque[Answer | Callable[[dict[str, Any]], Reply | Failure]] = deque()
        self.conversations: dict[str, list[Reply]] = {}  # by what the user messages mention
        self.requests: list[Request] = []
        #: Set when a client closed its connection while a dribbled or oversized answer was
        #: still being sent.
        self.dropped = threading.Event()
        self._stopping = threading.Event()  # ends a dribble in flight when the server stops
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default) per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    # -- the script --------------------------------------------------------------------------

    def reply(self, **fields: Any) -> None:
        self.script.append(Reply(**fields))

    def fail(
        self,
        status: int,
        retry_after: float | None = None,
        message: str = "busy",
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.script.append(Failure(status, retry_after, message, param, code))

    def garble(
        self, body: str | None = None, content_type: str = "text/html", encoding: str | None = None
    ) -> None:
        """Answer 200 with `body` as it is (not a completion), under `encoding` if given."""
        self.script.append(Garbled(body or Garbled.body, content_type, encoding))

    def dribble(self, interval_s: float = 0.05, status: int = 200) -> None:
        """Send the next answer a byte every `interval_s`."""
        self.script.append(Dribble(interval_s, status))

    def oversize(self, size: int, *, declared: bool = False, gzip: bool = False) -> None:
        """Send the next answer padded to `size` bytes (see `Oversized`)."""
        self.script.append(Oversized(size, declared, gzip))

    def converse(self, script: list[Reply], *, mentioning: str = "") -> None:
        """Once the queue is empty, a conversation whose user messages mention `mentioning` (the
        first such registration wins; "" means any) gets `script` in order, then "done"."""
        self.conversations[mentioning] = list(script)

    def dynamic(self, answer: Callable[[dict[str, Any]], Reply | Failure]) -> None:
        """An answer computed from the request (to look at what the agent was shown)."""
        self.script.append(answer)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The bodies the server accepted, in order."""
        return [r.body for r in self.requests if r.refused is None and r.answered == 200]

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.requests)} of {count} requests came")
            time.sleep(0.02)

    # -- serving -----------------------------------------------------------------------------

    def _next(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            item = self.script.popleft() if self.script else None
        if item is None:
            item = self._conversation_reply(body)
        answer = item(body) if callable(item) else item
        if isinstance(answer, Reply) and answer.tool_calls:
            # Like the scripted model: `${CALL_ID.path}` takes what an earlier result returned
            # (an evidence id the host made up at run time), read from this request's history.
            answer = replace(answer, tool_calls=_resolved(answer.tool_calls, body))
        return answer

    def _conversation_reply(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        said = " ".join(str(m.get("content")) for m in messages if m.get("role") == "user")
        script = next((s for key, s in self.conversations.items() if key in said), [])
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return script[turn] if turn < len(script) else Reply(content="done")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if server.lm_studio and self.path.rstrip("/") != "/v1/chat/completions":
                    server.requests.append(Request({}, None, 200))
                    said = f"Unexpected endpoint or method. (POST {self.path})"
                    self._send(200, {"error": said})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                problem = strict_problem(body)
                if problem is None and server.mistral:
                    problem = mistral_problem(body)
                if problem is not None:
                    server.requests.append(Request(body, problem, 400))
                    self._send(400, {"error": {"message": problem, "type": "invalid_request"}})
                    return
                answer = server._next(body)
                if isinstance(answer, Dribble | Oversized):
                    server.requests.append(Request(body, None, 200))
                    completion = json.dumps(server._completion(body, _PLAIN[type(answer)]))
                    try:
                        if isinstance(answer, Dribble):
                            self._dribble(answer, completion.encode())
                        else:
                            self._oversized(answer, completion.encode())
                    except ConnectionError:
                        server.dropped.set()
                        self.close_connection = True
                    return
                if isinstance(answer, Garbled):
                    server.requests.append(Request(body, None, 200))
                    data = answer.body.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", answer.content_type)
                    if answer.encoding is not None:
                        self.send_header("Content-Encoding", answer.encoding)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if isinstance(answer, Failure):
                    server.requests.append(Request(body, None, answer.status))
                    headers = {}
                    if answer.retry_after is not None:
                        headers["Retry-After"] = f"{answer.retry_after:g}"
                    error: dict[str, Any] = {"message": answer.message}
                    if answer.param is not None:
                        error.update(param=answer.param, code=answer.code)
                    self._send(answer.status, {"error": error}, headers)
                    return
                server.requests.append(Request(body, None, 200))
                delay = max(answer.delay_s, server.delay_s)
                if delay:
                    time.sleep(delay)
                if answer.stream:
                    data = _event_stream(server._completion(body, answer)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if answer.gzip:
                    data = gzip.compress(json.dumps(server._completion(body, answer)).encode())
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._send(200, server._completion(body, answer))

            def _dribble(self, answer: Dribble, data: bytes) -> None:
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for index in range(len(data)):
                    self.wfile.write(data[index : index + 1])
                    if server._stopping.wait(answer.interval_s):
                        return

            def _oversized(self, answer: Oversized, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if answer.declared:
                    self.send_header("Content-Length", str(max(answer.size, len(data))))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                if answer.gzip:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                pieces = _padded(answer.size - len(data), data)
                if answer.gzip:
                    pieces = _gzipped(pieces)
                for piece in pieces:
                    if answer.declared:
                        self.wfile.write(piece)
                    elif piece:
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                if not answer.declared:
                    self.wfile.write(b"0\r\n\r\n")

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        if reply.reasoning is not None:
            message["reasoning"] = reply.reasoning
        if reply.function_call is not None:
            message["function_call"] = reply.function_call
        prompt, completion = reply.usage or (len(json.dumps(body["messages"])) // 4, 7)
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.finish_reason
                    or ("tool_calls" if reply.tool_calls else None)
                    or ("function_call" if reply.function_call else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


#: What a dribbled and an oversized answer say, once read.
_PLAIN: dict[type, Reply] = {Dribble: Reply(content="done"), Oversized: Reply(content="padded")}
_MIB = 1024 * 1024


def _event_stream(completion: dict[str, Any]) -> str:
    """`completion` as a server streams it: the role, the text in two pieces, each tool call's
    id and name and then its arguments in two pieces (the calls' pieces interleaved, as their
    `index` allows), the finish reason, the usage in a chunk of its own, then `[DONE]`."""
    choice = completion["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    for name in ("content", "reasoning_content", "reasoning"):
        text = message.get(name)
        if isinstance(text, str):
            deltas += [{name: text[: len(text) // 2]}, {name: text[len(text) // 2 :]}]
    calls = message.get("tool_calls") or []
    for index, item in enumerate(calls):
        function = item["function"]
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": item["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
    for half in (0, 1):
        for index, item in enumerate(calls):
            text = item["function"]["arguments"]
            piece = text[: len(text) // 2] if half == 0 else text[len(text) // 2 :]
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if message.get("function_call"):
        deltas.append({"function_call": message["function_call"]})
    head = {key: completion[key] for key in ("id", "created", "model")}
    chunks = [
        {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
        for delta in deltas
    ]
    chunks[-1]["choices"][0]["finish_reason"] = choice["finish_reason"]
    chunks.append(
        {**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]}
    )
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"


def _padded(padding: int, data: bytes) -> Iterator[bytes]:
    """`padding` bytes of whitespace a MiB at a time, then `data`."""
    block = b" " * _MIB
    while padding > 0:
        yield block[: min(padding, _MIB)]
        padding -= _MIB
    yield data


def _gzipped(pieces: Iterator[bytes]) -> Iterator[bytes]:
    encoder = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    for piece in pieces:
        yield encoder.compress(piece)
    yield encoder.flush()


class _Server(ThreadingHTTPServer):
    """A thread per connection; a backlog deep enough for hundreds of clients connecting at once
    (socketserver's default of 5 would make a burst of them wait on SYN retries)."""

    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up on a slow answer (its timeout, a cancel) is what the tests
        make happen: not a traceback on stderr. Anything else still prints."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


_MISTRAL_ID = re.compile(r"[a-zA-Z0-9]{9}")


def mistral_problem(body: dict[str, Any]) -> str | None:
    """Why Mistral's chat template refuses this history (vLLM's words), or None: every
    tool-call id, in the assistant's calls and the tool messages, is 9 letters and digits."""
    for message in body.get("messages") or []:
        ids = [c.get("id") for c in message.get("tool_calls") or ()]
        if message.get("role") == "tool":
            ids.append(message.get("tool_call_id"))
        for call_id in ids:
            if not isinstance(call_id, str) or not _MISTRAL_ID.fullmatch(call_id):
                return f"Tool call id was {call_id} but must be a-z, A-Z, 0-9, with a length of 9."
    return None


def strict_problem(body: dict[str, Any]) -> str | None:
    """Why a strict server refuses this request body, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict):
            return "a tool must be {'type': 'function', 'function': {...}}"
        if not function.get("name") or not isinstance(function.get("parameters", {}), dict):
            return "a function tool needs a name and object parameters"
    open_calls: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            return f"messages[{index}]: unknown role {role!r}"
        if role == "tool":
            if not open_calls:
                return f"messages[{index}]: a tool message must answer a preceding tool call"
            expected = open_calls.pop(0)
            if message.get("tool_call_id") != expected:
                return (
                    f"messages[{index}]: tool_call_id {message.get('tool_call_id')!r} "
                    f"out of order; expected {expected!r}"
                )
            if not isinstance(message.get("content"), str):
                return f"messages[{index}]: tool content must be a string"
            continue
        if open_calls:
            return f"messages[{index}]: tool calls {open_calls} have no tool message"
        if role == "assistant" and "tool_calls" in message:
            calls = message["tool_calls"]
            if not isinstance(calls, list) or not calls:
                return f"messages[{index}]: tool_calls must be a non-empty list"
            for item in calls:
                function = item.get("function") if isinstance(item, dict) else None
                if (
                    item.get("type") != "function"
                    or not item.get("id")
                    or not isinstance(function, dict)
                    or not isinstance(function.get("arguments"), str)
                ):
                    return f"messages[{index}]: a tool call must be id/type/function(arguments)"
                try:
                    json.loads(function["arguments"])
                except json.JSONDecodeError:
                    return f"messages[{index}]: tool call arguments are not JSON"
            open_calls = [item["id"] for item in calls]
        elif role == "assistant" and message.get("content") is None:
            return f"messages[{index}]: an assistant message needs content or tool calls"
    if open_calls:
        return f"tool calls {open_calls} have no tool message"
    return None


def _resolved(calls: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages") or []
    out = []
    for wire in calls:
        function = dict(wire.get("function") or {})
        raw = function.get("arguments")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else None
        except (ValueError, RecursionError):  # nested past json's depth, too
            arguments = None  # a malformed call stays malformed
        if isinstance(arguments, dict):
            function["arguments"] = json.dumps(resolve_refs(arguments, messages))
        out.append({**wire, "function": function})
    return out
