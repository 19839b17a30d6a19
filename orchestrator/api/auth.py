"""Bearer tokens: ORCH_API_TOKEN for public routes, AGENT_INTERNAL_TOKEN for the internal bridge.

Tokens are compared in constant time and never appear in a log line or an error message.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from orchestrator.errors import Unauthorized
from orchestrator.settings import Settings

__all__ = ["require_api_token", "require_internal_token"]


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _check_bearer(request: Request, expected: str) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    # compare_digest on bytes: constant time for any content, also non-ASCII.
    matches = hmac.compare_digest(presented.strip().encode(), expected.encode())
    if scheme.lower() != "bearer" or not matches:
        raise Unauthorized("missing or wrong bearer token")


def require_api_token(request: Request) -> None:
    """Public routes: a bearer token is required only when ORCH_API_TOKEN is set."""
    expected = _settings(request).api_token
    if expected:
        _check_bearer(request, expected)


def require_internal_token(request: Request) -> None:
    """The internal tool bridge: always needs AGENT_INTERNAL_TOKEN; unset means closed."""
    expected = _settings(request).agent_internal_token
    if not expected:
        raise Unauthorized("the internal bridge is closed: AGENT_INTERNAL_TOKEN is not set")
    _check_bearer(request, expected)
