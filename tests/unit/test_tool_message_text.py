"""`ToolResult.message_text`: the JSON the model is sent, and the payload written only once.

The host writes a result's payload as JSON to measure it (is it large enough to page?); the
message is made from that text rather than by writing the payload again, and reads exactly as
`json.dumps(to_message(), default=str, ensure_ascii=False)` would.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.tools import source_rows
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from orchestrator.tools.source_declarations import Limits

CTX = ToolContext(owner="alice", session_id="s1", round_id="r1")


class Written:
    """A value JSON writes with `str`: counts how often it is written."""

    def __init__(self) -> None:
        self.times = 0

    def __str__(self) -> str:
        self.times += 1
        return "written"


class Returns(Tool):
    """Returns the payload it was built with."""

    name = "returns"
    description = "returns"
    arguments = ToolArguments

    def __init__(self, result: ToolResult) -> None:
        self.result = result

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return self.result


def _shown(result: ToolResult) -> ToolResult:
    return ToolHost([Returns(result)], ledger=None).run_turn(CTX, [ToolCall("c", "returns", {})])[0]


def _expected(result: ToolResult) -> str:
    return json.dumps(result.to_message(), default=str, ensure_ascii=False)


AWKWARD = {
    "tuple": (1, (2, "three")),
    1: "an int key",
    None: "a None key",
    2.5: "a float key",
    "when": datetime(2026, 12, 5, 7, 0, tzinfo=UTC),
    "amount": Decimal("1.10"),
    "twice": {3: "int", "3": "str"},
    "text": '汉字 \u2028 \x01 "quoted" \\u0000 a\ud800b',
    "numbers": [0, -0.0, 1e100, 2**70, float("nan")],
}


@pytest.mark.parametrize(
    "payload",
    [AWKWARD, [AWKWARD, "x"], 'a plain "string" 汉', 7, 1.5, True, {}, [], None],
    ids=["dict", "list", "str", "int", "float", "bool", "empty-dict", "empty-list", "none"],
)
def test_a_result_the_host_measured_is_sent_as_its_envelope_written_with_str(
    payload: Any,
) -> None:
    shown = _shown(ToolResult(status="succeeded", payload=payload, message="m", code="c"))
    assert shown.message_text == _expected(shown)
    cited = replace(shown, evidence_id="e1", queried_at="2026-12-05", content_ref="sha256:x")
    assert cited.message_text == _expected(cited)


def test_the_payload_is_written_once_from_the_tool_to_the_model() -> None:
    written = Written()
    shown = _shown(ToolResult.ok({"rows": [{"at": written}] * 3}))
    assert written.times == 3  # the host measured it
    assert json.loads(shown.message_text)["result"] == {"rows": [{"at": "written"}] * 3}
    assert written.times == 3  # and the message did not write it again


def test_another_payload_in_the_same_result_is_written_anew() -> None:
    shown = _shown(ToolResult.ok({"rows": [1, 2]}))
    other = replace(shown, payload={"rows": [3]})
    assert json.loads(other.message_text)["result"] == {"rows": [3]}
    assert other.message_text == _expected(other)


ROWS: list[Any] = [
    {"time": datetime(2026, 12, 5, 7, m, tzinfo=UTC), "value": m / 10, 1: ("a", "汉字")}
    for m in range(30)
]


@pytest.mark.parametrize(
    ("rows", "limit", "max_chars"),
    [(ROWS, 100, 50_000), (ROWS, 10, 50_000), (ROWS, 100, 500), ([], 100, 50_000)],
    ids=["whole", "row-limit", "character-limit", "empty"],
)
def test_a_data_source_answer_carries_its_payload_text(
    rows: list[Any], limit: int, max_chars: int
) -> None:
    start, end = datetime(2026, 12, 5, tzinfo=UTC), datetime(2026, 12, 6, tzinfo=UTC)
    result = source_rows.envelope(
        "scada_sim", "synthetic", start, end, rows, limit, Limits(max_chars=max_chars)
    )
    text = result.written_payload()
    assert text == json.dumps(result.payload, ensure_ascii=False, default=str)
    assert result.message_text == _expected(result)


def test_a_data_source_answer_is_written_once_from_the_tool_to_the_model() -> None:
    written = Written()
    start, end = datetime(2026, 12, 5, tzinfo=UTC), datetime(2026, 12, 6, tzinfo=UTC)
    answer = source_rows.envelope("s", "synthetic", start, end, [{"at": written}] * 3, 10, Limits())
    assert written.times == 3  # the tool measured its rows
    shown = _shown(answer)
    assert json.loads(shown.message_text)["result"]["rows"] == [{"at": "written"}] * 3
    assert written.times == 3  # neither the host nor the message wrote them again


def test_a_string_payload_is_paged_as_itself_whatever_text_it_carries() -> None:
    text = 'say "hi" ' * 1000
    result = ToolResult.ok(text).with_payload_text(json.dumps(text))
    assert result.message_text == _expected(result)
    shown = _shown(result)
    assert shown.payload["truncated"] is True
    assert shown.payload["total_chars"] == len(text)  # not the length of its JSON text
    assert shown.payload["preview"] == text[: len(shown.payload["preview"])]
