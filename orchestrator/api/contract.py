"""The API contract in one place: the error envelope, the list shape, paging, the bearer scheme.

Every route adopts these, so a generated client can trust the schema:

- `responses=error_responses(404, 409)` documents a route's own errors with the envelope
  `{"error": {"code", "message", "details"}}`; `create_app` adds `COMMON_ERRORS` (401, 413, 422,
  503) to every public route and `declare_write_refusals` a 403 to every public write (a viewer
  only reads), so a route lists only what is particular to it.
- `Page[ItemModel]` is the one list shape, `{"items": [...], "next_cursor": ...}`; `paged()`
  cuts a `limit + 1` fetch into a page and the cursor of the next one (keyset, see
  `orchestrator.domain.cursors`).
- `BEARER` and `INTERNAL_BEARER` declare the schemes in the OpenAPI document; the checks
  themselves stay in `orchestrator.api.auth`.
- The closed vocabularies are enums (`orchestrator.api.enums`), so a client knows every value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from orchestrator.api.wire_types import WAKE_UP_DISPATCHED, IsoTime  # re-exported
from orchestrator.domain.cursors import encode_cursor
from orchestrator.domain.storable import FilledText, StoredText  # the API's, re-exported

__all__ = [
    "BEARER",
    "COMMON_ERRORS",
    "INTERNAL_BEARER",
    "WAKE_UP_DISPATCHED",
    "ErrorBody",
    "ErrorEnvelope",
    "FilledText",
    "IsoTime",
    "Page",
    "StoredText",
    "declare_write_refusals",
    "error_responses",
    "paged",
]

ItemT = TypeVar("ItemT")
RowT = TypeVar("RowT")

#: ORCH_API_TOKEN on public routes (declared only; `auth` checks it).
BEARER = HTTPBearer(
    scheme_name="bearer", description="ORCH_API_TOKEN, when it is set", auto_error=False
)
#: AGENT_INTERNAL_TOKEN on the internal tool bridge.
INTERNAL_BEARER = HTTPBearer(
    scheme_name="internal_bearer", description="AGENT_INTERNAL_TOKEN", auto_error=False
)


class ErrorBody(BaseModel):
    code: str = Field(description="stable, machine-readable")
    message: str
    details: list[dict[str, Any]] = Field(
        description="every problem found: {code, message, field?}; the first gives `code`"
    )


class ErrorEnvelope(BaseModel):
    """Every error response of the API."""

    error: ErrorBody


_DESCRIPTIONS = {
    400: "bad request",
    401: "missing or wrong bearer token",
    403: "the account's role does not allow this (forbidden)",
    404: "no such resource",
    409: "conflicts with the current state (stale generation, already decided, ...)",
    413: "the request body is larger than ORCH_MAX_BODY_BYTES",
    422: "the request is not valid",
    429: "too many wrong tokens from the caller's address (too_many_failures); retry after "
    "Retry-After",
    502: "the model behind the answer failed (model_error)",
    503: "the store is unreachable or busy (store_unavailable); retry after Retry-After",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses, each with the error envelope."""
    return {
        status: {"model": ErrorEnvelope, "description": _DESCRIPTIONS[status]}
        for status in statuses
    }


#: What any public route may answer whatever it does; added by `create_app`.
COMMON_ERRORS = error_responses(401, 413, 422, 429, 503)


def declare_write_refusals(routes: Sequence[object]) -> None:
    """Document 403 on every public write: a viewer account may only read, whichever role the
    route itself asks for (`auth.require_api_token` refuses it before the route runs). Given
    a router's own routes, before `include_router` copies them (the copy reads the response
    models once); idempotent."""
    for route in routes:
        if isinstance(route, APIRoute) and (route.methods or set()) - {"GET", "HEAD"}:
            for status, response in error_responses(403).items():
                route.responses.setdefault(status, response)


class Page(BaseModel, Generic[ItemT]):
    """One page of a list, newest first."""

    model_config = ConfigDict(extra="forbid")

    items: list[ItemT]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )


def paged(
    rows: Sequence[RowT],
    limit: int,
    key: Callable[[RowT], tuple[datetime, str]],
    *,
    oldest_first: bool = False,
) -> tuple[list[RowT], str | None]:
    """The first `limit` of `rows` (fetched as `limit + 1`) and the cursor after them (marked
    as an oldest-first list's when it is one: see `encode_cursor`)."""
    items = list(rows[:limit])
    if len(rows) > limit and items:
        return items, encode_cursor(*key(items[-1]), oldest_first=oldest_first)
    return items, None
