"""`call_api`: the business backend, described by an OpenAPI 3 document, as one agent tool.

The effect is decided per operation (`x-effect`, default: GET/HEAD read, others write), so the
host routes each write through a receipt and keeps read-only agents away from it. What happened
on the wire decides the status (seed 000): nothing sent or an explicit 4xx → `failed`; a break
after sending, a timeout, an unreadable answer or a 5xx on a write → `unknown`; 202 → `pending`.
Only requests that provably never left are retried, and only as many times as configured.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import Field, ValidationError

from orchestrator.domain.fingerprints import NonCanonical, fingerprint, refuse_non_finite
from orchestrator.domain.outcomes import Outcome, model_message, tool_status
from orchestrator.errors import ValidationFailed
from orchestrator.settings import Settings
from orchestrator.tools.base import (
    Effect,
    Identity,
    Tool,
    ToolArguments,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.openapi import ApiSpec, Operation, load_spec

__all__ = ["CallApi", "CallApiArgs", "DescribeApiOperation", "gateway_tools"]

_MAX_ERROR_BODY = 2000


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
        normalized = values.model_dump(mode="json", by_alias=True, exclude_none=True)
        return CallApiArgs(operation_id=operation.operation_id, arguments=normalized)

    def verify(self, ctx: ToolContext, args: Any) -> bool | None:
        """Read a full-replacement, non-sensitive setting back and compare fingerprints."""
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
        outcome, status, body = self._send(
            verifier, values.model_dump(mode="json", by_alias=True, exclude_none=True)
        )
        if status == 404:
            return False
        if outcome != "succeeded" or status is None or not 200 <= status < 300:
            return None
        try:
            return bool(fingerprint(body) == fingerprint(args.arguments["body"]))
        except NonCanonical:
            return None

    # -- the call ----------------------------------------------------------------------------

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        operation = self.operation(args)
        writes = operation.effect == "write"
        outcome, status, body = self._send(operation, args.arguments)
        payload: dict[str, Any] = {"operation_id": operation.operation_id}
        if status is not None:
            payload["http_status"] = status
        if body is not None:
            payload["body"] = body
        result_status = tool_status(outcome, writes=writes)
        message = model_message(outcome) if writes or result_status != "succeeded" else None
        return ToolResult(
            status=result_status,
            payload=payload,
            message=message,
            code=None if outcome == "succeeded" else outcome,
            outcome=outcome,
        )

    def _send(
        self, operation: Operation, arguments: dict[str, Any]
    ) -> tuple[Outcome, int | None, Any]:
        """Send one request: (outcome, HTTP status if an answer came, decoded body)."""
        path = operation.path
        query: dict[str, Any] = {}
        headers: dict[str, str] = {}
        for parameter in operation.parameters:
            if parameter.name not in arguments:
                continue
            value = arguments[parameter.name]
            if parameter.location == "path":
                path = path.replace("{" + parameter.name + "}", quote(str(value), safe=""))
            elif parameter.location == "query":
                query[parameter.name] = value
            else:
                headers[parameter.name] = str(value)
        # A fresh connection a call: a stale pooled keep-alive connection must not turn a
        # request that never reached the server into an "unknown".
        transport = httpx.HTTPTransport(retries=self.connect_retries)
        try:
            with httpx.Client(
                base_url=self.base_url, timeout=self.timeout, transport=transport
            ) as client:
                response = client.request(
                    operation.method,
                    path,
                    params=query or None,
                    headers=headers or None,
                    json=arguments.get("body") if operation.has_body else None,
                )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            return "not_sent", None, None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL):
            return "not_sent", None, None
        except (httpx.ReadTimeout, httpx.WriteTimeout):
            return "timed_out", None, None
        except httpx.HTTPError:
            return "transport_broken", None, None
        return self._answer(operation, response)

    @staticmethod
    def _answer(operation: Operation, response: httpx.Response) -> tuple[Outcome, int, Any]:
        status = response.status_code
        try:
            body = _decode(response)
        except ValueError:
            if 200 <= status < 300:
                return "unreadable_response", status, None
            body = response.text[:_MAX_ERROR_BODY]
        if 200 <= status < 300:
            if status == 202 and operation.effect == "write":
                return "submitted", status, body
            return "succeeded", status, body
        if isinstance(body, str):
            body = body[:_MAX_ERROR_BODY]
        if 400 <= status < 500:
            return "rejected", status, body
        return "server_error", status, body


def _decode(response: httpx.Response) -> Any:
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
    base_url = settings.gateway_base_url or (spec.servers[0] if spec.servers else None)
    if not base_url:
        raise ValidationFailed(
            "ORCH_GATEWAY_BASE_URL is not set and the gateway spec names no server"
        )
    return [
        CallApi(
            spec,
            base_url,
            timeout_seconds=settings.gateway_timeout_seconds,
            connect_retries=settings.gateway_connect_retries,
        ),
        DescribeApiOperation(spec),
    ]
