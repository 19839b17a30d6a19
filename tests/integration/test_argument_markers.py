"""Arguments as gpt-oss servers leak them, through the real `openai` client and loopback server.

A server that parses gpt-oss's harmony format into `tool_calls` has sent a call's arguments
with the format's markers left on (`{"a": 1}<|call|>`, `<|message|>{"a": 1}`); the host
answered each `invalid_arguments` ("not valid JSON"), the model was shown its call back without
the markers, sent it again, and the round ended with no report. The arguments are now read
without the known markers by an exact rule (`orchestrator.agent.argument_markers`), and the
transcript keeps what was cut.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.argument_markers import read_arguments
from orchestrator.services.tasks import Trigger
from tests.executions_support import query_call
from tests.openai_server import OpenAIServer, Reply, call
from tests.transcript_support import openai_runtime


@pytest.mark.parametrize(
    ("sent", "read", "cut"),
    [
        ('{"a": 1}', {"a": 1}, None),
        ('{"a": 1}<|call|>', {"a": 1}, {"after": "<|call|>"}),
        ('{"a": 1} <|end|>\n', {"a": 1}, {"after": "<|end|>"}),
        ('{"a": 1}<|call|><|return|>', {"a": 1}, {"after": "<|call|><|return|>"}),
        ('<|message|>{"a": 1}', {"a": 1}, {"before": "<|message|>"}),
        (
            '<|constrain|>json<|message|>{"a": "<|x|>"}<|call|>',
            {"a": "<|x|>"},
            {"before": "<|constrain|>json<|message|>", "after": "<|call|>"},
        ),
        # Not an object once the known markers are cut, or other text: never guessed.
        ('{"a": 1<|call|>', None, None),
        ("[1]<|call|>", None, None),
        ('{"a": 1}<|channel|>', None, None),
        ('{"a": 1}<|call|>x', None, None),
        ('json{"a": 1}', None, None),
        ('<|start|>{"a": 1}', None, None),
        ("<|call|>", None, None),
    ],
)
def test_markers_are_cut_only_by_the_exact_rule(
    sent: str, read: dict[str, Any] | None, cut: dict[str, str] | None
) -> None:
    arguments, problem, markers = read_arguments(sent)
    if read is None:
        assert (arguments, markers) == ({}, None)
        assert problem is not None
    else:
        assert (arguments, problem, markers) == (read, None, cut)


def _gpt_oss(body: dict[str, Any]) -> Reply:
    """The report, sent with the markers on both ends, citing the query's evidence."""
    shown = [json.loads(m["content"]) for m in body["messages"] if m.get("role") == "tool"]
    evidence_id = shown[0]["evidence_id"]
    report = {
        "summary": "turbidity is normal",
        "findings": [],
        "outcome": "completed",
        "evidence_ids": [evidence_id],
    }
    text = f"<|constrain|>json<|message|>{json.dumps(report)}<|call|>"
    return Reply(tool_calls=[call("c2", "save_report", text)])


def test_a_gpt_oss_report_with_leaked_markers_is_saved(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        q = query_call()
        server.reply(tool_calls=[call(q["id"], q["name"], json.dumps(q["arguments"]) + "<|call|>")])
        server.dynamic(_gpt_oss)
        server.reply(content="done")
        task = rt.tasks.trigger(Trigger(task_type="water", title="Turbid")).task
        assert rt.executions.run(task.task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task.task_id)["items"]
    finally:
        rt.close()
    results = [(e["tool_name"], e["status"]) for e in entries if e["kind"] == "tool_result"]
    assert results == [("query_data_source", "succeeded"), ("save_report", "succeeded")]
    saved = next(e["body"]["result"] for e in entries if e.get("tool_name") == "save_report")
    assert saved["outcome"] == "completed"
    calls = [c for e in entries if e["kind"] == "model_turn" for c in e["body"]["tool_calls"]]
    assert [c.get("arguments_markers") for c in calls] == [
        {"after": "<|call|>"},
        {"before": "<|constrain|>json<|message|>", "after": "<|call|>"},
    ]
    assert calls[0]["arguments"] == q["arguments"]
    assert "raw_arguments" not in calls[1]
    # The history sent back carries the arguments as read: valid JSON, no markers.
    sent_back = [
        c["function"]["arguments"]
        for m in server.bodies[2]["messages"]
        for c in m.get("tool_calls") or ()
    ]
    assert all("<|" not in text for text in sent_back)
