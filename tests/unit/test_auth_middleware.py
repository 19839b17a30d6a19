"""The bearer-token middleware decides on path and header alone: a refused request's body is
never read, and the tokens never appear in what it sends back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from orchestrator.api.auth import BearerTokens, bearer_matches
from orchestrator.settings import Settings

INTERNAL = "/api/v1/internal"


def settings(api: str | None = "public-token", internal: str | None = "internal-token") -> Settings:
    return Settings(api_token=api, agent_internal_token=internal, database_url=None)


def call(
    middleware_settings: Settings, path: str, authorization: bytes | None = None
) -> tuple[int, dict[str, Any] | None, bool]:
    """(status, JSON body, whether the inner app ran); receiving the body fails the test."""
    reached = False

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> Any:
        raise AssertionError("the body was read before the token check")

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers,
             "query_string": b""}  # fmt: skip
    app = BearerTokens(
        inner, settings=middleware_settings, internal_prefix=INTERNAL, open_paths=("/healthz",)
    )
    asyncio.run(app(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    for secret in (b"public-token", b"internal-token"):
        assert secret not in body
        assert all(secret not in value for _, value in sent[0]["headers"])
    return status, (json.loads(body) if body else None), reached


@pytest.mark.parametrize(
    ("path", "authorization", "allowed"),
    [
        (f"{INTERNAL}/sessions/s/execution-plans", None, False),
        (f"{INTERNAL}/sessions/s/execution-plans", b"Bearer public-token", False),
        (f"{INTERNAL}/sessions/s/execution-plans", b"Bearer internal-token", True),
        (f"{INTERNAL}/sessions/s/execution-plans", b"bearer  internal-token ", True),
        (f"{INTERNAL}/sessions/s/execution-plans", b"internal-token", False),
        (INTERNAL, None, False),
        ("/api/v1/sessions", None, False),
        ("/api/v1/sessions", b"Bearer internal-token", False),
        ("/api/v1/sessions", b"Bearer public-token", True),
        ("/api/v1/internalx", b"Bearer public-token", True),  # not under the prefix
        ("/openapi.json", None, False),
        ("/docs", None, False),
        ("/no-such-route", None, False),
        ("/healthz", None, True),
    ],
)
def test_paths_and_tokens(path: str, authorization: bytes | None, allowed: bool) -> None:
    status, body, reached = call(settings(), path, authorization)
    assert reached is allowed
    if not allowed:
        assert status == 401
        assert body is not None
        assert body["error"]["code"] == "unauthorized"


def test_without_tokens_public_is_open_and_the_bridge_closed() -> None:
    open_settings = settings(api=None, internal=None)
    assert call(open_settings, "/api/v1/sessions")[2]
    status, body, reached = call(open_settings, f"{INTERNAL}/x", b"Bearer anything")
    assert (status, reached) == (401, False)
    assert body is not None
    assert "AGENT_INTERNAL_TOKEN" in body["error"]["message"]


def test_bearer_matches_compares_bytes() -> None:
    assert bearer_matches("Bearer tøken".encode(), "tøken")
    assert not bearer_matches(b"Bearer t\xf8ken", "tøken")  # latin-1 is not the same token
    assert not bearer_matches(b"", "x")
    assert not bearer_matches(b"Bearer ", "x")
    assert not bearer_matches(b"Basic x", "x")
