"""A tool result's transcript entry is the JSON the model was shown, written from that very text.

The loop sends the model `clean_text(result.message_text)`. The transcript keeps the same JSON:
values JSON cannot hold as they are (tuples, keys that are not strings, objects written with
`str`, a key written twice once it is a string) read back as the model read them, on both
stores. The text is not parsed and written again to get there (a query's answer is ~15 KB).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.model import ModelTurn
from orchestrator.agent.text import clean_text
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.store import transcripts as transcript_store
from orchestrator.tools.base import ToolCall, ToolResult
from tests.executions_support import runtime_for
from tests.transcript_support import claimed

#: Values whose JSON text reads back as something else than the value.
AWKWARD: dict[Any, Any] = {
    "tuple": (1, (2, "three")),
    1: "an int key",
    None: "a None key",
    False: "a bool key",
    2.5: "a float key",
    "when": datetime(2026, 12, 5, 7, 0, tzinfo=UTC),
    "amount": Decimal("1.10"),
    "twice": {3: "the int key, written first", "3": "the str key, written last"},
    "text": '汉字 \u2028 \x01 \t \\u0000 is text, "quoted" 🙂',
    "numbers": [0, -0.0, 2**70, 0.1, 1.5],
}


def _written(store_url: str, scripts: Path, result: ToolResult) -> dict[str, Any]:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        call = ToolCall("c1", "t", {})
        writer.model_turn(1, {}, ModelTurn(None, (call,)))
        writer.tool_results(1, [call], [result])
        writer.flush()
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert entries[-1]["kind"] == "tool_result"
        body: dict[str, Any] = entries[-1]["body"]
        return body
    finally:
        rt.close()


@pytest.mark.parametrize(
    "payload",
    [AWKWARD, {"lone": "a\ud800b", "pair": "\ud83d\ude42", "nul": "a\x00b"}],
    ids=["awkward", "unclean"],
)
def test_the_transcript_keeps_the_json_the_model_was_shown(
    store_url: str, scripts: Path, payload: dict[Any, Any]
) -> None:
    result = ToolResult(status="succeeded", payload=payload, evidence_id="e1", message="m")
    shown = json.loads(clean_text(result.message_text))  # what the loop sends the model
    assert shown != result.to_message()  # the awkward values do not read back as themselves
    body = _written(store_url, scripts, result)
    if "nul" in payload:
        shown["result"]["nul"] = "a\ufffdb"  # NUL: the store cannot hold it
    assert body == shown
    if "nul" in payload:
        assert body["result"] == {"lone": "a\ufffdb", "pair": "🙂", "nul": "a\ufffdb"}
    else:
        assert body["result"]["twice"] == {"3": "the str key, written last"}
        assert body["result"]["tuple"] == [1, [2, "three"]]
        assert body["result"]["when"] == "2026-12-05 07:00:00+00:00"
        assert body["result"]["null"] == "a None key"
        assert body["result"]["false"] == "a bool key"


def test_a_result_shown_as_it_is_is_written_from_the_text_the_model_was_shown(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[transcript_store.Entry] = []
    for name in ("insert_entries", "insert_entries_fenced"):
        original = getattr(transcript_store, name)

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            sent.extend(kwargs["entries"])
            return _original(*args, **kwargs)

        monkeypatch.setattr(transcript_store, name, spy)
    result = ToolResult.ok({"rows": [{"value": n / 10} for n in range(50)]})
    body = _written(store_url, scripts, result)
    assert body == json.loads(result.message_text)
    [entry] = [e for e in sent if e.kind == "tool_result"]
    # Not parsed and written again: the very text (a query's answer is ~15 KB of it).
    assert entry.body_json is result.message_text
