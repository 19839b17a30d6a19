"""What the OpenAPI contract says of every route: the error envelope and the list shape.

Routes declare their error responses with `errors(401, 404, ...)`, so a generated client knows
the envelope `{"error": {"code", "message", "details"}}` of each status.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

__all__ = ["ErrorBody", "ErrorEnvelope", "Page", "errors"]

T = TypeVar("T")


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. stale_approval")
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class Page(BaseModel, Generic[T]):
    """One list shape everywhere: the items and the cursor of the next page (None at the end)."""

    items: list[T]
    next_cursor: str | None = None


_WHAT = {
    401: "missing or wrong bearer token",
    403: "the account's role does not allow this (forbidden)",
    404: "no such resource (not_found)",
    409: "the request conflicts with the stored state",
    422: "the request is not valid",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each status with the error envelope."""
    return {status: {"model": ErrorEnvelope, "description": _WHAT[status]} for status in statuses}
