"""Keyset cursors for list views: an opaque token of the last row's (created_at, id).

Every list of the API pages the same way: newest first, ordered by (created_at, id), and the
cursor names the last row already seen, so a page never repeats or skips a row however many are
inserted meanwhile. The cursor is base64 of JSON; anything that does not decode is a 422.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from orchestrator.domain.storable import storable_text
from orchestrator.errors import ValidationFailed

__all__ = [
    "OLDEST",
    "decode_cursor",
    "decode_position",
    "encode_cursor",
    "encode_position",
    "invalid_cursor",
]


def _pack(values: list[object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def _unpack(cursor: str) -> Any:
    """The JSON a cursor holds; raises ValueError (or binascii/Unicode errors) otherwise."""
    return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


#: The mark an oldest-first page's cursor carries (a list offered in both orders, the actions').
OLDEST = "oldest"


def encode_cursor(created_at: datetime, row_id: str, *, oldest_first: bool = False) -> str:
    """The cursor after the row; an oldest-first list's is marked so, so that it cannot be
    asked of the list in the other order (which would answer an empty page, not an error)."""
    values: list[object] = [created_at.isoformat(), row_id]
    return _pack([*values, OLDEST] if oldest_first else values)


def encode_position(generation: int, seq: int) -> str:
    """The cursor of a transcript entry: lists in the order they were written, oldest first,
    page by the last (generation, seq) seen."""
    return _pack([generation, seq])


def decode_position(cursor: str) -> tuple[int, int]:
    """The (generation, seq) of a position cursor; anything else is 422 `invalid_cursor`."""
    try:
        generation, seq = _unpack(cursor)
        numbers = (generation, seq)
        if not all(type(n) is int and 0 <= n < 2**31 for n in numbers):
            raise ValueError("bad cursor")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise invalid_cursor() from None
    return generation, seq


def _other_order(oldest: bool) -> ValidationFailed:
    said, other = ("oldest", "newest") if oldest else ("newest", "oldest")
    message = f"cursor is from the {said}-first list; ask it with that order, not {other} first"
    return ValidationFailed(
        message,
        code="invalid_cursor",
        details=[{"code": "invalid_cursor", "message": message, "field": "cursor"}],
    )


def invalid_cursor() -> ValidationFailed:
    """The 422 `invalid_cursor` error, for a cursor this API did not return."""
    message = "cursor is not one this API returned"
    return ValidationFailed(
        message,
        code="invalid_cursor",
        details=[{"code": "invalid_cursor", "message": message, "field": "cursor"}],
    )


def decode_cursor(cursor: str, *, oldest_first: bool = False) -> tuple[datetime, str]:
    """The (created_at in UTC, id) of a cursor of a list in that order; anything else is 422
    `invalid_cursor` (a cursor of the other order says so).

    The conversion to UTC happens inside the check: a forged offset near the ends of the
    calendar overflows, and must not reach the store; nor must an id no store keeps.
    """
    try:
        values = _unpack(cursor)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise invalid_cursor() from None
    marked = isinstance(values, list) and len(values) == 3 and values[2] == OLDEST
    if marked != oldest_first and isinstance(values, list) and len(values) == (2 + marked):
        raise _other_order(marked)
    try:
        stamp, row_id = values[:2] if marked else values
        if not isinstance(stamp, str) or not isinstance(row_id, str):
            raise ValueError("bad cursor")
        storable_text(row_id)  # a forged NUL or lone surrogate would fail in the store
        moment = datetime.fromisoformat(stamp)
        if moment.tzinfo is None:
            raise ValueError("bad cursor")
        moment = moment.astimezone(UTC)
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise invalid_cursor() from None
    return moment, row_id
