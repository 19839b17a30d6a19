"""`call_api`: the business backend, described by an OpenAPI 3 document, as one agent tool.

The effect is decided per operation (`x-effect`, default: GET/HEAD read, others write), so the
host routes each write through a receipt and keeps read-only agents away from it. What happened
on the wire decides the status (seed 000): nothing sent or an explicit 4xx → `failed`; a break
after sending, a timeout, an unreadable answer or a 5xx on a write → `unknown`; 202 → `pending`.
Only requests that provably never left are retried, and only as many times as configured.

"Provably never left" is watched on the wire (httpcore's trace hooks): anything raised before
the request headers start to go out (building the request, connecting, TLS), and a request the
HTTP layer refused to serialise, is `not_sent` → `failed`; anything after that is `unknown`.
Header values are checked during argument validation, so an unsendable one is refused up front.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, ClassVar, NamedTuple
from urllib.parse import quote

import httpcore
import httpx
from pydantic import Field, ValidationError

from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.fingerprints import (
    NonCanonical,
    refuse_non_finite,
    same_json_value,
)
from orchestrator.domain.outcomes import Outcome, model_message, tool_status
from orchestrator.errors import ValidationFailed
from orchestrator.settings import Settings
from orchestrator.tools.argument_models import dump_arguments
from orchestrator.tools.base import (
    Effect,
    Identity,
    Tool,
    ToolArguments,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.http_answers import Answer, AnswerTooLarge, read_answer
from orchestrator.tools.openapi import SPEC_SETTING, ApiSpec, Operation, load_spec
from orchestrator.tools.paging import more_past, rows_sent
from orchestrator.tools.spec_errors import SpecError

__all__ = ["CallApi", "CallApiArgs", "DescribeApiOperation", "gateway_tools", "holds_written"]

log = logging.getLogger(__name__)

_MAX_ERROR_BODY = 2000
# Control characters other than HTAB cannot be in an HTTP field value (RFC 9110 5.5).
_HEADER_CONTROL = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F))
# The user information of a URL (`user:password@`), which may hold the backend's credentials.
_USERINFO = re.compile(r"^((?:[^:/?#\s]+:)?//)?[^/?#\s]*@")


class CallApiArgs(ToolArguments):
    operation_id: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="path, query and header parameters by name; the JSON request body as 'body'",
    )


class CallApi(Tool):
    """One tool for every operation of the business backend."""

    name = "call_api"
    description = "Call an operation of the business backend."
    effect = "write"  # the default for the host's bookkeeping; `effect_for` decides per call
    identity: ClassVar[Identity] = "intent"
    arguments = CallApiArgs

    def __init__(
        self,
        spec: ApiSpec,
        base_url: str,
        *,
        timeout_seconds: float = 10.0,
        connect_retries: int = 0,
    ) -> None:
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.timeout = httpx.Timeout(timeout_seconds)
        self.connect_retries = connect_retries

    def schema(self) -> dict[str, Any]:
        listed = "; ".join(
            f"{op.operation_id} ({op.effect}{', sensitive' if op.sensitive else ''})"
            + (f": {op.summary}" if op.summary else "")
            for op in self.spec.operations.values()
        )
        body = super().schema()
        body["description"] = (
            f"Call an operation of {self.spec.title}. Use describe_api_operation to see an "
            f"operation's arguments. Operations: {listed}"
        )
        return body

    # -- host hooks --------------------------------------------------------------------------

    def read_uses(self) -> str | None:
        # What a read-only caller may call: never a sensitive value (`x-sensitive` included).
        reads = [
            op.operation_id
            for op in self.spec.operations.values()
            if op.effect == "read" and not op.sensitive
        ]
        if not reads:
            return None
        return f"call_api with a read operation ({', '.join(reads)})"

    def operation(self, args: CallApiArgs) -> Operation:
        operation = self.spec.operations.get(args.operation_id)
        if operation is None:
            raise ValidationFailed(f"unknown operation_id {args.operation_id!r}")
        return operation

    def effect_for(self, args: Any) -> Effect:
        return self.operation(args).effect

    def normalize(self, args: Any) -> CallApiArgs:
        """Validate against the operation's parameters and body; fill defaults, coerce types."""
        operation = self.operation(args)
        try:
            refuse_non_finite(args.arguments)
        except NonCanonical as exc:
            raise ValidationFailed(f"{operation.operation_id}: {exc}") from None
        try:
            values = operation.model.model_validate(args.arguments)
        except ValidationError as exc:
            details = [
                {
                    "code": "invalid_argument",
                    "message": f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}",
                }
                for e in exc.errors(include_url=False, include_input=False)
            ]
            text = "; ".join(detail["message"] for detail in details[:10])
            raise ValidationFailed(f"{operation.operation_id}: {text}", details=details) from None
        normalized = _wire_arguments(operation, dump_arguments(values))
        problems = _header_problems(operation, normalized)
        if problems:
            details = [{"code": "invalid_argument", "message": text} for text in problems]
            raise ValidationFailed(
                f"{operation.operation_id}: {'; '.join(problems)}", details=details
            )
        # Exactly this is fingerprinted by the host and exactly this is sent.
        return CallApiArgs(operation_id=operation.operation_id, arguments=normalized)

    def verify(self, ctx: ToolContext, args: Any) -> bool | None:
        """Read a full-replacement, non-sensitive setting back: verified when it holds every
        written field with an equal value (`holds_written`)."""
        operation = self.operation(args)
        if operation.verify_with is None or operation.sensitive or "body" not in args.arguments:
            return None
        verifier = self.spec.operations[operation.verify_with]
        names = {parameter.name for parameter in verifier.parameters}
        read_args = {k: v for k, v in args.arguments.items() if k in names}
        try:
            values = verifier.model.model_validate(read_args)
        except ValidationError:
            return None
        read = _wire_arguments(verifier, dump_arguments(values))
        if _header_problems(verifier, read):
            return None
        outcome, status, body, _ = self._send(verifier, read)
        if status == 404:
            return False
        if outcome != "succeeded" or status is None or not 200 <= status < 300:
            return None
        try:
            return holds_written(body, args.arguments["body"])
        except NonCanonical:
            return None

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts | None:
        """A successful non-sensitive read of the business backend is citable (origin live:
        the gateway is the business backend itself)."""
        operation = self.operation(args)
        if operation.effect != "read" or result.status != "succeeded":
            return None
        payload = result.payload if isinstance(result.payload, dict) else {}
        body = payload.get("body")
        return EvidenceFacts(
            kind="call_api",
            source=f"call_api:{operation.operation_id}",
            origin="live",
            # A page of a longer answer is part of it, as a preview the host cut is.
            truncated=more_past(body, rows_sent(body)) is not None,
            row_count=len(body) if isinstance(body, list) else None,
            params={"operation_id": operation.operation_id, "arguments": args.arguments},
            content=body,
        )

    # -- the call ----------------------------------------------------------------------------

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        operation = self.operation(args)
        writes = operation.effect == "write"
        outcome, status, body, detail = self._send(operation, args.arguments)
        payload: dict[str, Any] = {"operation_id": operation.operation_id}
        if status is not None:
            payload["http_status"] = status
        if body is not None:
            payload["body"] = body
        result_status = tool_status(outcome, writes=writes)
        message = model_message(outcome) if writes or result_status != "succeeded" else None
        if detail is not None and message is not None:
            message = f"{message} ({detail})"
        return ToolResult(
            status=result_status,
            payload=payload,
            message=message,
            code=None if outcome == "succeeded" else outcome,
            outcome=outcome,
        )

    def _send(self, operation: Operation, arguments: dict[str, Any]) -> _Sent:
        """Send one request: the outcome, the HTTP status if an answer came, the decoded body.

        Whatever goes wrong before the request starts to leave the client is `not_sent`.
        """
        wire = _Wire()
        # A fresh connection a call: a stale pooled keep-alive connection must not turn a
        # request that never reached the server into an "unknown".
        try:
            client = httpx.Client(
                base_url=self.base_url,
                timeout=self.timeout,
                transport=httpx.HTTPTransport(retries=self.connect_retries),
            )
        except Exception as exc:
            log.warning("call_api %s: no HTTP client: %r", operation.operation_id, exc)
            return _Sent("not_sent", detail=f"the request could not be built: {_name(exc)}")
        with client:
            try:
                request = _build(client, operation, arguments, wire)
            except Exception as exc:
                log.warning("call_api %s: request not built: %r", operation.operation_id, exc)
                return _Sent("not_sent", detail=f"the request could not be built: {_name(exc)}")
            try:
                response = read_answer(client, request, body_seconds=self.timeout_seconds)
            except AnswerTooLarge as exc:
                return _too_large(exc)
            except Exception as exc:
                return _failure(operation, exc, left=wire.left)
        return self._answer(operation, response)

    @staticmethod
    def _answer(operation: Operation, response: Answer) -> _Sent:
        status = response.status_code
        try:
            body = _decode(response)
        except ValueError:
            if 200 <= status < 300:
                return _Sent("unreadable_response", status)
            body = response.text[:_MAX_ERROR_BODY]
        if 200 <= status < 300:
            if status == 202 and operation.effect == "write":
                return _Sent("submitted", status, body)
            return _Sent("succeeded", status, body)
        if isinstance(body, str):
            body = body[:_MAX_ERROR_BODY]
        if 400 <= status < 500:
            return _Sent("rejected", status, body)
        return _Sent("server_error", status, body)


def holds_written(read_back: Any, written: Any) -> bool:
    """A full replacement is in place when the read-back holds every written field with an
    equal value; fields the server adds (ids, timestamps, the key) do not prevent a match. A
    written value that is not an object must come back equal."""
    if isinstance(written, dict):
        if not isinstance(read_back, dict):
            return False
        return all(
            key in read_back and same_json_value(read_back[key], value)
            for key, value in written.items()
        )
    return same_json_value(read_back, written)


def _build(
    client: httpx.Client, operation: Operation, arguments: dict[str, Any], wire: _Wire
) -> httpx.Request:
    path = operation.path
    query: dict[str, Any] = {}
    headers: dict[bytes, bytes] = {}
    for parameter in operation.parameters:
        if parameter.name not in arguments:
            continue
        value = arguments[parameter.name]
        if parameter.location == "path":
            path = path.replace("{" + parameter.name + "}", quote(str(value), safe=""))
        elif parameter.location == "query":
            query[parameter.name] = value
        else:
            # Names are HTTP tokens (checked in the spec); values were checked as Latin-1.
            headers[parameter.name.encode("ascii")] = _header_text(value).encode("latin-1")
    content: bytes | None = None
    if operation.has_body and "body" in arguments:
        content = json.dumps(
            arguments["body"], ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
        if not any(name.lower() == b"content-type" for name in headers):
            headers[b"Content-Type"] = b"application/json"
    return client.build_request(
        operation.method,
        path,
        params=query or None,
        headers=headers or None,
        content=content,
        extensions={"trace": wire.trace},
    )


class _Sent(NamedTuple):
    outcome: Outcome
    status: int | None = None
    body: Any = None
    detail: str | None = None


class _Wire:
    """Whether any byte of the request may have left the client (httpcore trace events).

    Before `send_request_headers` starts, only the connection was being set up. Inside it the
    HTTP layer first serialises the request (a `LocalProtocolError` there means nothing was
    written) and then writes it; from that write on, the request may have been received.
    """

    def __init__(self) -> None:
        self.left = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(".send_request_headers.started"):
            self.left = True
        elif event.endswith(".send_request_headers.failed") and isinstance(
            info.get("exception"), httpcore.LocalProtocolError
        ):
            self.left = False


def _too_large(exc: AnswerTooLarge) -> _Sent:
    """An answer past the cap: it came, so the request was received; its body is not kept."""
    status = exc.status_code
    if 200 <= status < 300:
        return _Sent("unreadable_response", status)
    return _Sent("rejected" if 400 <= status < 500 else "server_error", status, str(exc))


def _failure(operation: Operation, exc: Exception, *, left: bool) -> _Sent:
    if not left:
        log.info("call_api %s: not sent: %r", operation.operation_id, exc)
        return _Sent("not_sent", detail=f"it never left the client: {_name(exc)}")
    if isinstance(exc, httpx.TimeoutException):
        return _Sent("timed_out")
    if isinstance(exc, httpx.HTTPError):
        return _Sent("transport_broken")
    log.warning("call_api %s: raised after sending: %r", operation.operation_id, exc)
    return _Sent("raised")


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _wire_arguments(operation: Operation, dumped: dict[str, Any]) -> dict[str, Any]:
    """A parameter has no wire form for null: an explicit null parameter is left out. Nulls in
    the body are kept (the schema allowed them)."""
    names = {parameter.name for parameter in operation.parameters}
    return {k: v for k, v in dumped.items() if not (k in names and v is None)}


def _header_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return str(value)


def _header_problems(operation: Operation, arguments: dict[str, Any]) -> list[str]:
    """Header values that HTTP/1.1 cannot carry: sent, they would fail inside the client."""
    problems: list[str] = []
    for parameter in operation.parameters:
        if parameter.location != "header" or parameter.name not in arguments:
            continue
        value = arguments[parameter.name]
        if isinstance(value, dict | list):
            problems.append(f"{parameter.name}: a header value must be a single value")
            continue
        text = _header_text(value)
        try:
            text.encode("latin-1")
        except UnicodeEncodeError:
            problems.append(
                f"{parameter.name}: a header value must be ISO-8859-1 (Latin-1) text; "
                "encode other characters before passing them"
            )
            continue
        if any(char in _HEADER_CONTROL for char in text):
            problems.append(f"{parameter.name}: a header value may not hold control characters")
        elif text != text.strip(" \t"):
            problems.append(f"{parameter.name}: a header value may not start or end with spaces")
    return problems


def _decode(response: Answer) -> Any:
    if not response.content:
        return None
    content_type = response.headers.get("content-type", "")
    if "json" in content_type:
        return json.loads(response.content.decode("utf-8"))
    return response.content.decode("utf-8")


class DescribeArgs(ToolArguments):
    operation_id: str = Field(min_length=1, max_length=128)


class DescribeApiOperation(Tool):
    """`describe_api_operation`: the argument schema of one business operation (read-only)."""

    name = "describe_api_operation"
    description = "Show the arguments, effect and verifier of one call_api operation."
    effect = "read"
    arguments = DescribeArgs

    def __init__(self, spec: ApiSpec) -> None:
        self.spec = spec

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        operation = self.spec.operations.get(args.operation_id)
        if operation is None:
            return ToolResult.failed(
                f"unknown operation_id {args.operation_id!r}", code="unknown_operation"
            )
        return ToolResult.ok(
            {
                "operation_id": operation.operation_id,
                "method": operation.method,
                "path": operation.path,
                "effect": operation.effect,
                "sensitive": operation.sensitive,
                "verify_with": operation.verify_with,
                "summary": operation.summary,
                "arguments": operation.arguments_schema(),
            }
        )


def gateway_tools(settings: Settings) -> list[Tool]:
    """The gateway tools for the agent: none unless `ORCH_GATEWAY_SPEC` is set."""
    if settings.gateway_spec is None:
        return []
    spec = load_spec(settings.gateway_spec)
    where = f"{SPEC_SETTING} ({settings.gateway_spec})"
    base_url = settings.gateway_base_url or (spec.servers[0] if spec.servers else None)
    if not base_url:
        raise SpecError(
            f"{where}: ORCH_GATEWAY_BASE_URL is not set and the document names no server"
        )
    try:
        url = httpx.URL(base_url)
    except Exception:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        source = "ORCH_GATEWAY_BASE_URL" if settings.gateway_base_url else "the document's server"
        # The line is printed as it is at worker start: never the credentials it may carry.
        shown = _USERINFO.sub(r"\1***@", base_url)
        raise SpecError(f"{where}: {source} {shown!r} is not an absolute http(s) URL")
    return [
        CallApi(
            spec,
            base_url,
            timeout_seconds=settings.gateway_timeout_seconds,
            connect_retries=settings.gateway_connect_retries,
        ),
        DescribeApiOperation(spec),
    ]
