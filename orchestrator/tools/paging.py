"""Whether an upstream JSON answer says it holds only part of what was asked for.

A backend that pages its answers returns the first page and a way to the next one (a cursor, a next
link, `has_more`), or a total above what it sent, at the top of the answer or one level down where
many APIs keep them (`links.next`, `meta.total`, `pageInfo.hasNextPage`). The host records such an
answer as truncated, as it records a result it cut itself: a finding that says "no anomaly in the
whole range" cannot rest on the first page (invariant 12). The names are the ones APIs commonly use;
an answer that pages under another name is not recognised, so a data source whose backend does that
should ask for pages small enough to fit in one answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["more_past", "rows_sent"]

#: Keys whose non-empty value leads to the next page.
_NEXT_KEYS: Final = (
    "next_cursor",
    "nextCursor",
    "next_page_token",
    "nextPageToken",
    "next_page",
    "nextPage",
    "next_url",
    "next_link",
    "nextLink",
    "@odata.nextLink",
    "next_token",
    "nextToken",
    "NextToken",
    "continuation_token",
    "continuationToken",
    "next",
)
#: Keys whose true value says more rows follow.
_MORE_KEYS: Final = ("has_more", "hasMore", "hasNextPage", "has_next_page", "more")
#: Keys that count every row of the answer's range, sent or not.
_TOTAL_KEYS: Final = ("total", "total_count", "totalCount")
#: Keys under which many APIs keep the paging keys above, one level down: JSON:API and
#: Laravel (`links.next`, `meta.total`), HAL (`_links.next.href`), Graph APIs (`paging.next`,
#: `pageInfo.hasNextPage`), `pagination.has_more`.
_PAGING_KEYS: Final = ("links", "_links", "paging", "pagination", "meta", "pageInfo", "page_info")


def more_past(body: Any, sent: int | None) -> str | None:
    """Why `body` (an answer holding `sent` rows; None: not a list of rows) is only part of
    what was asked for, or None."""
    if not isinstance(body, Mapping):
        return None
    why = _said(body, sent, "")
    for container in _PAGING_KEYS:
        inner = body.get(container)
        if why is None and isinstance(inner, Mapping):
            why = _said(inner, sent, f"{container}.")
    return why


def _said(body: Mapping[str, Any], sent: int | None, where: str) -> str | None:
    """What the paging keys of `body` (found at `where`) say of more rows, or None."""
    for key in _NEXT_KEYS:
        value = body.get(key)
        if value not in (None, "", False, [], {}):
            return f"the source has more rows past this answer (its {where + key!r} leads to them)"
    for key in _MORE_KEYS:
        if body.get(key) is True:
            return f"the source has more rows past this answer (its {where + key!r} is true)"
    for key in _TOTAL_KEYS:
        total = body.get(key)
        if sent is not None and isinstance(total, int) and not isinstance(total, bool):
            if total <= sent:
                continue
            return f"the source counts {total} rows in range (its {where + key!r}) and sent {sent}"
    return None


def rows_sent(body: Any) -> int | None:
    """How many rows an answer holds: a list's length, or that of its `rows`, `items`, `data`
    or `results` list; None for an answer that is no list of rows."""
    if isinstance(body, list):
        return len(body)
    if isinstance(body, dict):
        for key in ("rows", "items", "data", "results"):
            if isinstance(body.get(key), list):
                return len(body[key])
    return None
