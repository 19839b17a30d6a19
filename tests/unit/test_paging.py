"""Which upstream answers say they hold only part of what was asked for."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.tools.paging import more_past


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        ({"rows": [1], "next_cursor": "c2"}, 1),
        ({"items": [1], "nextPageToken": "t"}, 1),
        ({"results": [1], "next": "https://api.example/r?page=2"}, 1),
        ({"data": [1], "has_more": True}, 1),
        ({"items": [1, 2], "total": 3}, 2),
        ({"items": [], "total_count": 1}, 0),
    ],
)
def test_a_page_with_a_way_to_more_or_a_larger_total_is_part_of_the_answer(
    body: dict[str, Any], sent: int
) -> None:
    assert more_past(body, sent) is not None


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        ([1, 2, 3], 3),
        ({"rows": [1], "next_cursor": None}, 1),
        ({"rows": [1], "next": ""}, 1),
        ({"rows": [1], "has_more": False}, 1),
        ({"items": [1, 2], "total": 2}, 2),
        ({"items": [1], "total": True}, 1),  # a flag, not a count
        ({"value": 3, "total": 40}, None),  # not a list of rows: its total is business data
        ("text", None),
    ],
)
def test_a_whole_answer_is_not_taken_for_a_page(body: Any, sent: int | None) -> None:
    assert more_past(body, sent) is None


def test_the_reason_names_what_the_source_said() -> None:
    reason = more_past({"items": [1, 2], "total": 500}, 2)
    assert reason == "the source counts 500 rows in range (its 'total') and sent 2"
