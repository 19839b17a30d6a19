"""A recovery snapshot built from a transcript an older version wrote: a tool call of another
shape is an unknown call (its outcome cannot be read), never a failed explain view."""

from __future__ import annotations

from typing import Any

from orchestrator.api.explain_views import RecoveryView
from orchestrator.domain.recovery import Snapshot


def turn(turn: int, body: Any) -> dict[str, Any]:
    return {"kind": "model_turn", "turn": turn, "body": body}


def test_calls_of_an_older_shape_are_unknown_and_shown_as_text() -> None:
    entries = [
        turn(1, {"tool_calls": [{"id": "a", "name": "read_task_context", "arguments": {}}]}),
        {"kind": "tool_result", "turn": 1, "call_id": "a", "status": "succeeded", "body": {}},
        turn(2, {"tool_calls": [{"id": "b"}, "call_api"]}),  # no name; a bare string
        turn(3, {"tool_calls": {"id": "c", "name": "x"}}),  # one call, not a list
        turn(4, ["an", "older", "body"]),  # not an object
        {"kind": "tool_result", "turn": 4, "call_id": "b", "status": "failed", "body": []},
    ]
    snapshot = Snapshot.from_transcript(entries, reason="died", generation=1)
    sent = RecoveryView.model_validate(snapshot.to_dict()).model_dump(mode="json")
    assert [call["call_id"] for call in sent["done"]] == ["a"]
    readable, *unreadable = sent["unknown"]
    assert (readable["call_id"], readable["tool"], readable["turn"]) == ("c", "x", 3)
    assert unreadable == ['{"id": "b"}', "call_api"]
    assert sent["verify_first"]


def test_a_snapshot_of_today_is_sent_as_it_is() -> None:
    entries = [
        turn(1, {"tool_calls": [{"id": "a", "name": "call_api", "arguments": {"p": 1}}]}),
    ]
    snapshot = Snapshot.from_transcript(entries, reason="died", generation=2)
    sent = RecoveryView.model_validate(snapshot.to_dict()).model_dump(mode="json")
    assert sent == snapshot.to_dict()
    assert sent["unknown"][0]["arguments"] == {"p": 1}
