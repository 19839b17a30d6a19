"""Domain errors. Each carries a stable `code` that the API and the CLI show as is."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConflictError",
    "ConstraintViolation",
    "Forbidden",
    "InvalidTransition",
    "NotFound",
    "OrchestratorError",
    "StaleGeneration",
    "Unauthorized",
    "ValidationFailed",
    "echoed",
]

#: The most of a caller's id an error message repeats (a UUID is 36 characters).
ECHO_LIMIT = 80


def echoed(value: object) -> str:
    """A caller's id (from the path, mostly) as an error message repeats it: clipped.

    A 404 used to echo the id whole, at any length (a 5,000-character action id came back in
    the message, and in every log line that quoted it). The length said stays exact.
    """
    text = str(value)
    if len(text) <= ECHO_LIMIT:
        return text
    return f"{text[:ECHO_LIMIT]}... ({len(text)} characters)"


class OrchestratorError(Exception):
    """Base of every error the orchestrator reports to a caller."""

    code = "error"
    http_status = 400

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or []

    def to_dict(self) -> dict[str, Any]:
        """The error envelope body: `{"error": {"code", "message", "details"}}`."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class ValidationFailed(OrchestratorError):
    """Input broke a rule; `details` lists every problem found, the first one gives the code."""

    code = "validation_failed"
    http_status = 422


class NotFound(OrchestratorError):
    code = "not_found"
    http_status = 404


class ConflictError(OrchestratorError):
    code = "conflict"
    http_status = 409


class ConstraintViolation(ConflictError):
    """The store refused a write because a constraint would break; nothing was written."""

    code = "constraint_violation"


class InvalidTransition(ConflictError):
    code = "invalid_transition"


class StaleGeneration(ConflictError):
    """A write came from an execution generation that is no longer the live one."""

    code = "stale_generation"


class Unauthorized(OrchestratorError):
    code = "unauthorized"
    http_status = 401


class Forbidden(OrchestratorError):
    """The caller is known, but their role (or the record's owner) does not allow the request."""

    code = "forbidden"
    http_status = 403
