"""Column types that behave the same on Postgres and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = ["JSONDocument", "UTCDateTime", "stored_list", "utcnow"]

#: JSONB on Postgres, JSON (text) on SQLite.
JSONDocument = JSON().with_variant(JSONB(), "postgresql")


def stored_list(stored: Any) -> list[Any]:
    """A JSON document column that holds a list, as a list; a single value an older version
    stored instead is one item (not a dict's keys, not a string's characters), so a reader
    shows what it cannot read rather than failing."""
    if stored is None:
        return []
    return list(stored) if isinstance(stored, list) else [stored]


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always stored and returned as aware UTC (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]
