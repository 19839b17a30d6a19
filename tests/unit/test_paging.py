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


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        # JSON:API and Laravel
        ({"data": [1], "links": {"self": "/r?page=1", "next": "/r?page=2"}}, 1),
        ({"data": [1, 2], "meta": {"total": 90}}, 2),
        # HAL
        ({"_embedded": {"r": [1]}, "_links": {"next": {"href": "/r?page=2"}}}, None),
        # OData (Microsoft Graph, Dynamics)
        ({"value": [1], "@odata.nextLink": "https://graph.example/r?$skiptoken=x"}, None),
        # AWS-style tokens
        ({"Items": [1], "NextToken": "abc"}, None),
        ({"items": [1], "nextToken": "abc"}, 1),
        # Graph APIs
        ({"data": [1], "paging": {"cursors": {"after": "x"}, "next": "https://g/r?after=x"}}, 1),
        ({"edges": [1], "pageInfo": {"hasNextPage": True, "endCursor": "x"}}, None),
        ({"data": [1], "pagination": {"has_more": True}}, 1),
    ],
)
def test_a_page_that_keeps_its_way_to_more_under_a_common_name_is_part_of_the_answer(
    body: dict[str, Any], sent: int | None
) -> None:
    assert more_past(body, sent) is not None


@pytest.mark.parametrize(
    "body",
    [
        {"data": [1], "links": {"self": "/r", "next": None}},
        {"_links": {"self": {"href": "/r"}}},
        {"value": [1], "@odata.context": "https://graph.example/$metadata"},
        {"items": [1], "nextToken": None},
        {"edges": [1], "pageInfo": {"hasNextPage": False, "endCursor": "x"}},
        {"data": [1, 2], "meta": {"total": 2}},
    ],
)
def test_the_last_page_of_those_shapes_is_whole(body: dict[str, Any]) -> None:
    assert more_past(body, 2 if "meta" in body else 1) is None


def test_the_reason_names_where_a_nested_link_was_found() -> None:
    reason = more_past({"data": [1], "links": {"next": "/r?page=2"}}, 1)
    assert reason == "the source has more rows past this answer (its 'links.next' leads to them)"
