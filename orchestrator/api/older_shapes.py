"""The one way a read route shows a stored part of an older or unexpected shape.

Records outlive the code that wrote them: a plan node from before nodes had an actor, a status
no longer known, an action payload that is a list, a transcript body that is not an object, or a
hand edit. A read route checks each such part against today's response model; a part that does
not fit is sent as its JSON text (a string stays itself) and the rest of the record as usual, so
an operator sees everything the store holds and never a 500. Only reading is widened: writes are
validated by the domain as before.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

__all__ = ["as_text_unless", "items_as_text_unless", "payload_as_sent"]


def as_text_unless(shape: Any, value: Any) -> Any:
    """`value` itself when it is a string or has `shape` (a model or a type), else its JSON
    text: the degraded form of a stored part of an older or unexpected shape."""
    if isinstance(value, str):
        return value
    try:
        _adapter(shape).validate_python(value)
    except ValidationError:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return value


@cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


def items_as_text_unless(shape: Any, items: Any) -> list[Any]:
    """Each item of a stored list checked against `shape`; a value that is not a list is one
    item."""
    return [as_text_unless(shape, item) for item in (items if isinstance(items, list) else [items])]


def payload_as_sent(payload: Any) -> Any:
    """An action's payload as the API sends it: an object, or the JSON text of one an older
    version stored in another shape (a list, a number; a string stays itself). Here, pydantic
    only: `actions list` and `show` send it so without importing FastAPI."""
    return as_text_unless(dict[str, Any], payload)
