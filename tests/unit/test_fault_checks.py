"""The fault campaign's verdicts (bench/fault_checks.py): writes done twice, fences broken."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.fault_checks import Accepted, Duplicate, duplicate_writes, late_rows

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_key_received_more_often_than_its_intent_rounds_is_a_duplicate() -> None:
    received = {"a": 1, "b": 2, "c": 2, "stray": 2}
    allowed = {"a": 1, "b": 1, "c": 2}  # c's task was requeued by an operator: a new intent
    assert duplicate_writes(received, allowed) == [
        Duplicate("b", 2, 1),
        Duplicate("stray", 2, 1),  # a key no task owns is allowed once
    ]
    assert duplicate_writes({"a": 1}, {"a": 1}) == []


def test_a_row_committed_after_a_later_generation_started_is_late() -> None:
    starts = [("t", 1, at(0)), ("t", 2, at(10)), ("t", 3, at(20)), ("u", 1, at(0))]
    on_time = Accepted("plan", "t", 1, at(9.999))
    late = Accepted("report", "t", 1, at(10.5))
    own = Accepted("plan", "t", 2, at(15))  # its own generation's rows keep coming
    other_task = Accepted("plan", "u", 1, at(30))
    found = late_rows([on_time, late, own, other_task], starts)
    assert [(x.row, x.later_generation, x.later_started_at) for x in found] == [(late, 2, at(10))]


def test_a_generation_never_started_fences_nothing_yet_and_the_earliest_later_one_is_named() -> (
    None
):
    starts = [("t", 1, at(0)), ("t", 2, None), ("t", 3, at(20))]
    assert late_rows([Accepted("plan", "t", 1, at(15))], starts) == []
    found = late_rows([Accepted("transcript", "t", 1, at(25))], starts)
    assert [x.later_generation for x in found] == [3]
    # A row of generation 2 committed after generation 3 started is late too.
    assert [x.later_generation for x in late_rows([Accepted("plan", "t", 2, at(21))], starts)] == [
        3
    ]


def test_deliveries_name_an_approval_lost_a_refusal_sent_and_events_out_of_order() -> None:
    from bench.fault_checks import OutboxRow, Post, delivery_findings

    actions = [("a1", "approved"), ("a2", "approved"), ("a3", "rejected"), ("a4", "superseded")]
    rows = [
        OutboxRow("1", "action", "delivered", "a1"),
        OutboxRow("2", "action", "pending", "a2"),
        OutboxRow("3", "webhook", "delivered", None),
        OutboxRow("4", "webhook", "delivered", None),
        OutboxRow("5", "webhook", "dead", None),
        OutboxRow("6", "webhook", "delivered", None),
    ]
    posts = [
        Post("actions", "1", "a1"),
        Post("actions", "1", "a1"),  # its dispatcher killed after the post: sent again
        Post("actions", "9", "a3"),  # a rejected action must never arrive
        Post("hooks", "4", None, "t", 2),
        Post("hooks", "3", None, "t", 1),  # seq 1 first arrived after seq 2
        Post("hooks", "3", None, "t", 1),
    ]
    found = delivery_findings(actions, rows, posts)
    assert found["approved_missing"] == ["a2"]
    assert found["approved_undelivered"] == ["a2"]
    assert found["not_approved_sent"] == ["a3"]
    assert found["events_undelivered"] == ["5"]
    assert found["events_unreceived"] == ["6"]
    assert found["out_of_order"] == ["t"]
    assert found["resent"] == 2
    assert found["received"] == 6


def test_deliveries_in_order_and_each_applied_once_find_nothing() -> None:
    from bench.fault_checks import OutboxRow, Post, delivery_findings

    found = delivery_findings(
        [("a1", "approved"), ("a2", "rejected")],
        [
            OutboxRow("1", "action", "delivered", "a1"),
            OutboxRow("2", "webhook", "delivered", None),
            OutboxRow("3", "webhook", "delivered", None),
        ],
        [
            Post("hooks", "2", None, "t", 1),
            Post("actions", "1", "a1"),
            Post("hooks", "3", None, "t", 2),
            Post("hooks", "2", None, "t", 1),
        ],
    )
    failures = ("approved_missing", "approved_undelivered", "not_approved_sent",
                "events_undelivered", "events_unreceived", "out_of_order")  # fmt: skip
    assert [name for name in failures if found[name]] == []
    assert found["resent"] == 1
