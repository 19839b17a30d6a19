"""The keyset condition every list pages by: the rows past the last (created_at, id) seen.

`created_at < t OR (created_at = t AND id < i)` is what a page needs, but Postgres cannot turn an
OR into an index range: it scanned the index from the newest row and filtered, so page n read
every row of the n-1 pages before it (a deep page of 50,000 tasks read 43,000 rows, 27 ms, where
the first read 52). The redundant bound `created_at <= t` comes first, which the planner does use
as the range, so every page reads about its own rows, however deep. SQLite reads it the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, or_

__all__ = ["past"]


def past(
    created_at: ColumnElement[Any],
    row_id: ColumnElement[Any],
    seen: tuple[datetime, str],
    *,
    newest_first: bool = True,
) -> ColumnElement[bool]:
    """Rows after `seen` in the list's order: older ones when `newest_first`, else newer."""
    at, seen_id = seen
    if newest_first:
        return and_(
            created_at <= at, or_(created_at < at, and_(created_at == at, row_id < seen_id))
        )
    return and_(created_at >= at, or_(created_at > at, and_(created_at == at, row_id > seen_id)))
