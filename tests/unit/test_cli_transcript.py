"""`orchestrator tasks transcript`'s page: each kind of entry as the transcript writer records."""

from __future__ import annotations

from orchestrator.cli.task_transcript import render_transcript


def _page(*items: dict[str, object]) -> dict[str, object]:
    total = {"calls": 1, "prompt_tokens": 900, "completion_tokens": 40}
    return {"task_id": "t-1", "items": list(items), "token_usage": {"total": total}}


def test_a_compaction_summary_shows_its_text() -> None:
    # agent/transcript.py's `compacted` records the text as `summary` (no `content`).
    summary = {
        "seq": 7,
        "generation": 1,
        "turn": 3,
        "kind": "summary",
        "usage": {"prompt_tokens": 900, "completion_tokens": 40},
        "body": {
            "summary": "the turbidity at DM-RN-01 rose after the main burst",
            "source": "model",
            "messages_replaced": 6,
            "tokens_before": 2400,
            "tokens_after": 300,
        },
    }
    shown = render_transcript(_page(summary))
    assert "summary: the turbidity at DM-RN-01 rose after the main burst" in shown


def test_a_call_with_unreadable_arguments_shows_what_the_model_sent_and_why() -> None:
    turn = {
        "seq": 1,
        "generation": 1,
        "turn": 1,
        "kind": "model_turn",
        "body": {
            "content": None,
            "tool_calls": [
                {"id": "c1", "name": "query", "arguments": {}, "raw_arguments": '{"site": "no'},
                {"id": "c2", "name": "query", "arguments": {"site": "north"}},
            ],
            "malformed": {"c1": "the arguments are not valid JSON (Unterminated string)"},
        },
    }
    shown = render_transcript(_page(turn))
    assert '-> c1 query raw {"site": "no' in shown
    assert "(not run: the arguments are not valid JSON (Unterminated string))" in shown
    assert '-> c2 query {"site": "north"}' in shown


def test_unreadable_arguments_of_a_tool_that_may_be_sensitive_are_redacted() -> None:
    from typing import Any

    from orchestrator.agent.transcript import may_be_sensitive
    from orchestrator.tools.base import Effect, Tool, ToolArguments, ToolContext, ToolResult

    class Plain(Tool):
        name = "plain"
        description = "plain"
        arguments = ToolArguments

        def run(self, ctx: ToolContext, args: Any) -> ToolResult:
            return ToolResult.ok()

    class Secret(Plain):
        effect = "sensitive_read"

    class PerCall(Plain):
        def effect_for(self, args: Any) -> Effect:
            return "sensitive_read"

    class Gateway(Plain):
        def operation(self, args: Any) -> Any:
            return None

    assert not may_be_sensitive(None)
    assert not may_be_sensitive(Plain())
    assert may_be_sensitive(Secret())
    assert may_be_sensitive(PerCall())
    assert may_be_sensitive(Gateway())


def test_a_reasoning_model_s_thinking_is_shown_before_its_answer_and_calls() -> None:
    # The writer records `reasoning_content` beside the text; a turn with reasoning only read
    # "model: (no answer)", as if the model had sent nothing.
    thinking = {
        "seq": 1,
        "generation": 1,
        "turn": 1,
        "kind": "model_turn",
        "usage": {"prompt_tokens": 900, "completion_tokens": 40},
        "body": {
            "content": None,
            "reasoning_content": "the meter   reads high;\nread the context first",
            "tool_calls": [{"id": "c1", "name": "read_task_context", "arguments": {}}],
        },
    }
    only = {
        "seq": 3,
        "generation": 1,
        "turn": 2,
        "kind": "model_turn",
        "body": {"content": None, "reasoning_content": "nothing left to do", "tool_calls": []},
    }
    lines = render_transcript(_page(thinking, only)).splitlines()
    assert lines[2] == "  [ 1] thinking: the meter reads high; read the context first"
    assert lines[3] == "  [ 1]   -> c1 read_task_context {}  [900+40 tokens]"
    assert lines[4] == "  [ 2] thinking: nothing left to do"
    assert lines[5] == "  [ 2] model: (no answer)"


def test_a_call_under_a_resolved_name_shows_what_the_model_sent() -> None:
    # agent/transcript.py records a leaked gpt-oss name the host resolved as `sent_name`.
    turn = {
        "seq": 1,
        "generation": 1,
        "turn": 2,
        "kind": "model_turn",
        "body": {
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "name": "save_report",
                    "arguments": {"outcome": "continue"},
                    "sent_name": "save_report<|channel|>commentary",
                }
            ],
        },
    }
    shown = render_transcript(_page(turn))
    assert "-> c2 save_report (sent as 'save_report<|channel|>commentary') {" in shown


def test_arguments_read_without_leaked_markers_show_the_markers_sent() -> None:
    # agent/transcript.py records the harmony markers cut from the arguments as
    # `arguments_markers` (agent/argument_markers.py).
    turn = {
        "seq": 1,
        "generation": 1,
        "turn": 2,
        "kind": "model_turn",
        "body": {
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "name": "save_report",
                    "arguments": {"outcome": "continue"},
                    "arguments_markers": {"before": "<|message|>", "after": "<|call|>"},
                }
            ],
        },
    }
    shown = render_transcript(_page(turn))
    assert '-> c2 save_report {"outcome": "continue"} (sent as <|message|>…<|call|>)' in shown
