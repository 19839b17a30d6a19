"""Conditional reads: an `ETag` on a view that is polled, `If-None-Match` answered `304`.

The console reads each open task's view every 3 s, its evidence and transcript pages every
15 s, and the task list every 6 s; nearly always nothing changed. The routes compute a tag from
what the answer is built from without building it (a task's view: `store.task_versions`; an
evidence or transcript page: its records' keys, from their index, records being never changed;
a page of the list: the records it is built from, as read); a client that sends the tag of the
answer it holds gets `304 Not Modified` and no body while it still holds. A changed resource is
answered as before, with its new tag.

The tag also names the shape of the answer (its response model's schema), so that a client
holding an answer of an older API is sent the new one after an upgrade.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import Header, Response
from pydantic import BaseModel

__all__ = ["IF_NONE_MATCH", "NOT_MODIFIED", "entity_tag", "not_modified", "shape_of", "tagged"]

#: The request header, as a route declares it (so that the OpenAPI document lists it).
IF_NONE_MATCH: Any = Header(
    default=None,
    alias="If-None-Match",
    max_length=1000,
    description="the `ETag` of the answer the client holds: `304` with no body while it still "
    "holds",
)

#: OpenAPI `responses` of a route that answers conditional reads.
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "unchanged since the answer whose `ETag` was sent (no body)"}
}


def shape_of(model: type[BaseModel]) -> str:
    """A short digest of `model`'s JSON schema: a part of every tag of its answers."""
    schema = json.dumps(model.model_json_schema(), sort_keys=True)
    return hashlib.sha256(schema.encode()).hexdigest()[:12]


def entity_tag(shape: str, version: object) -> str:
    """A strong tag (quoted) of an answer of `shape` built from `version` (its `repr` is
    stable: tuples of text, numbers, booleans and datetimes)."""
    digest = hashlib.sha256(f"{shape}|{version!r}".encode()).hexdigest()[:32]
    return f'"{digest}"'


def not_modified(if_none_match: str | None, tag: str) -> Response | None:
    """The `304` when `If-None-Match` names `tag` (or is `*`), else None. A weak tag the client
    sends (`W/"..."`) matches its strong one, as RFC 9110 has it for this header."""
    if if_none_match is None:
        return None
    sent = {part.strip().removeprefix("W/") for part in if_none_match.split(",")}
    if tag in sent or "*" in sent:
        return Response(status_code=304, headers={"ETag": tag})
    return None


def tagged(
    response: Response, if_none_match: str | None, shape: str, version: object
) -> Response | None:
    """The `304` when the client holds the answer of `shape` built from `version`; else None,
    with the answer's `ETag` set on `response` for the route to send it with its body."""
    tag = entity_tag(shape, version)
    unchanged = not_modified(if_none_match, tag)
    if unchanged is None:
        response.headers["ETag"] = tag
    return unchanged
