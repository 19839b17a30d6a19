"""Every time a route's response model sends is `IsoTime` (`...+00:00`, six fraction digits
always), never a plain `datetime` (pydantic's `...Z`): the next field someone adds cannot bring
a second form back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic import TypeAdapter

from orchestrator.api import console
from orchestrator.api.actions import ActionOut
from orchestrator.api.app import INTERNAL_ROUTERS, PUBLIC_ROUTERS
from orchestrator.api.task_stream import _as_sent
from orchestrator.cli import build_parser
from orchestrator.cli.common import print_json
from orchestrator.domain.times import wire_time


def _times(schema: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every datetime in a pydantic core schema (nested models, lists, unions, definitions),
    with the field names that lead to it."""
    if isinstance(schema, dict):
        if schema.get("type") == "datetime":
            yield where, schema
        for key, value in schema.items():
            if key == "fields" and isinstance(value, dict):
                for name, field in value.items():
                    yield from _times(field, f"{where}.{name}".lstrip("."))
            else:
                yield from _times(value, where)
    elif isinstance(schema, list):
        for value in schema:
            yield from _times(value, where)


def _sent_as_wire_time(schema: dict[str, Any]) -> bool:
    serializer = schema.get("serialization", {})
    return serializer.get("function") is wire_time  # type: ignore[no-any-return]


def test_every_time_in_a_response_model_is_sent_as_wire_time() -> None:
    checked, plain = 0, []
    routers = [*PUBLIC_ROUTERS, *INTERNAL_ROUTERS, console.router]
    for route in (route for router in routers for route in router.routes):
        if not isinstance(route, APIRoute) or route.response_model is None:
            continue
        schema = TypeAdapter(route.response_model).core_schema
        for field, time in _times(schema):
            checked += 1
            if not _sent_as_wire_time(time):
                plain.append(f"{sorted(route.methods)} {route.path}: {field}")
    assert not plain, "plain datetime (sent as ...Z) in:\n" + "\n".join(plain)
    assert checked >= 20  # the walk reaches the times (a task's, an execution's, a delivery's)


def test_a_time_is_sent_with_plus_00_00_six_digits_and_documented_as_date_time() -> None:
    action = ActionOut.model_validate(
        {
            "action_id": "a1",
            "task_id": "t1",
            "generation": 1,
            "session_id": "s1",
            "node_id": "n1",
            "kind": "work_order",
            "payload": {},
            "status": "approved",
            "digest": "d",
            "plan_revision": 1,
            "decided_by": "ops",
            "decided_at": "2026-12-05T09:12:40.586393Z",  # a client's form is read
            "note": None,
            "created_at": datetime(2026, 12, 5, 9, 12, tzinfo=UTC),
        }
    )
    sent = action.model_dump(mode="json")
    assert sent["decided_at"] == "2026-12-05T09:12:40.586393+00:00"
    # A whole second has its six zero digits: one width, not `...:00+00:00` beside the other.
    assert sent["created_at"] == "2026-12-05T09:12:00.000000+00:00"
    schema = ActionOut.model_json_schema(mode="serialization")["properties"]
    assert schema["created_at"] == {"type": "string", "format": "date-time", "title": "Created At"}
    assert {"type": "string", "format": "date-time"} in schema["decided_at"]["anyOf"]


def test_a_time_a_client_sends_may_take_either_form() -> None:
    """`--since` and `--until` read `...Z` and `...+00:00` as the same instant (the API's
    `created_after` and cursors do too: tests/integration/test_task_list_filters.py)."""
    parser = build_parser()
    zulu, offset = "2026-12-05T09:12:40Z", "2026-12-05T09:12:40+00:00"
    read = [parser.parse_args(["tasks", "list", "--since", when]).since for when in (zulu, offset)]
    assert read == [datetime(2026, 12, 5, 9, 12, 40, tzinfo=UTC)] * 2


def test_a_time_a_client_sends_may_take_rfc_3339_s_lower_case_t_and_z() -> None:
    """RFC 3339 allows `t` and `z` in lower case: docs/api.md says any RFC 3339 form is read."""
    parsed = build_parser().parse_args(["tasks", "list", "--since", "2026-12-05t09:12:40.5z"])
    assert parsed.since == datetime(2026, 12, 5, 9, 12, 40, 500000, tzinfo=UTC)


def test_the_cli_json_sends_a_whole_second_with_six_digits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_json({"at": datetime(2026, 12, 5, 9, 12, 40, tzinfo=UTC)})
    assert json.loads(capsys.readouterr().out) == {"at": "2026-12-05T09:12:40.000000+00:00"}


def test_the_task_stream_s_snapshot_sends_a_pending_action_s_time_in_the_one_form() -> None:
    """The `state` event is built from the store's records, not a response model."""
    action = {"action_id": "a1", "payload": {}, "created_at": datetime(2026, 12, 5, 9, tzinfo=UTC)}
    sent = _as_sent({"status": "waiting", "pending_actions": [action]})
    assert sent["pending_actions"][0]["created_at"] == "2026-12-05T09:00:00.000000+00:00"
