"""A server that does not parse the model's tool calls (vLLM without the model's
`--tool-call-parser`, llama.cpp without `--jinja`, a chat template without tools) returns them
as the reply's text, through the real `openai` client against the loopback server. Before, the
round took the text for the final answer and the task went round by round to its round limit
saying only "the round saved no report"; now the round ends `model_error` with one line that
says what to fix on the server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for
from tests.openai_server import OpenAIServer, call

REPORT = json.dumps(
    {"name": "save_report", "arguments": {"summary": "ok", "findings": [], "outcome": "completed"}}
)
#: gpt-oss's harmony call, as vLLM without `--tool-call-parser openai` returns it.
HARMONY = (
    "<|channel|>commentary to=functions.save_report <|constrain|>json<|message|>"
    '{"summary": "ok", "findings": [], "outcome": "completed"}<|call|>'
)


@pytest.mark.parametrize(
    "text",
    [
        f"<tool_call>\n{REPORT}\n</tool_call>",
        f"<think>the report now</think>\n{REPORT}",
        f"```json\n[{REPORT}]\n```",
        HARMONY,
        # Granite's and Phi-4-mini's marker; Llama 3.2's and Llama 4's pythonic calls.
        f"<|tool_call|>[{REPORT}]",
        "[save_report(summary='ok', findings=[], outcome='completed')]",
        "<|python_start|>[save_report(summary='ok', outcome='completed')]<|python_end|>",
        # Kimi K2's and MiniMax-M2's, from vLLM without kimi_k2 or minimax_m2.
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.save_report:0"
        '<|tool_call_argument_begin|>{"summary": "ok"}<|tool_call_end|><|tool_calls_section_end|>',
        '<minimax:tool_call>\n<invoke name="save_report">\n<parameter name="summary">ok'
        "</parameter>\n</invoke>\n</minimax:tool_call>",
        # After its thinking, in the analysis channel; the recipient in the role part.
        "<|channel|>analysis<|message|>The report now.<|end|><|start|>assistant "
        "to=functions.save_report<|channel|>commentary json<|message|>{}<|call|>",
    ],
)
def test_a_tool_call_written_as_text_ends_the_round_saying_what_to_fix(
    store_url: str, scripts: Path, server: OpenAIServer, text: str
) -> None:
    rt, _ = runtime_for(store_url, scripts, model="openai:test-model", llm_base_url=server.base_url)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(content=text)
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "failed"
        assert result.detail is not None
        assert "the model wrote a call of save_report as text instead of calling it" in (
            result.detail
        )
        assert "--tool-call-parser (gpt-oss: openai)" in result.detail
        assert "--jinja" in result.detail
        assert len(server.requests) == 2  # no more rounds of the same
        # The reply is in the transcript, and its call in the usage (before, the round ended
        # before the turn was recorded: the operator could not see what the model wrote).
        turns = [e for e in rt.tasks.transcript(task_id)["items"] if e["kind"] == "model_turn"]
        assert [t["body"]["content"] for t in turns] == [None, text]
        assert rt.tasks.explain(task_id)["token_usage"]["total"]["calls"] == 2
    finally:
        rt.close()


@pytest.mark.parametrize(
    "text",
    [
        'I would call save_report with {"name": "save_report"} next.',
        # Prose about the harmony markers, and a harmony answer that mentions a call.
        f"The server returned {HARMONY} as text; start it with --tool-call-parser openai.",
        "<|channel|>final<|message|>I would send to=functions.save_report next.<|return|>",
        "[save_report(summary='ok')] is what I would send next.",
    ],
)
def test_an_answer_that_names_a_tool_is_still_an_answer(
    store_url: str, scripts: Path, server: OpenAIServer, text: str
) -> None:
    rt, _ = runtime_for(store_url, scripts, model="openai:test-model", llm_base_url=server.base_url)
    try:
        server.reply(content=text)
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.detail == "the round saved no report"
    finally:
        rt.close()


#: Qwen3-Coder's XML call, as the model writes it inside its thinking (vLLM issue #39056).
XML_REPORT = (
    "<tool_call>\n<function=save_report>\n<parameter=summary>\nok\n</parameter>\n"
    "<parameter=outcome>\ncompleted\n</parameter>\n</function>\n</tool_call>"
)


@pytest.mark.parametrize(
    ("content", "field", "thinking"),
    [
        (None, "reasoning_content", f"<tool_call>\n{REPORT}\n</tool_call>"),
        (None, "reasoning_content", f"The data is in; I save the report.\n\n{XML_REPORT}\n"),
        ("\n\n", "reasoning_content", f"Done.\n<tool_call>\n{REPORT}\n</tool_call>"),
        ("", "reasoning", f"Done. {XML_REPORT}"),  # vLLM 0.10+'s field
        # Text beside a call that closes the thinking: written after a call never run.
        ("I'll save the report now.", "reasoning_content", f"<tool_call>\n{REPORT}\n</tool_call>"),
        ("The water is fine.", "reasoning_content", f"The data is in.\n{XML_REPORT}\n"),
        ("Saving it.", "reasoning", f"[TOOL_CALLS][{REPORT}]"),
        # The thinking's own end left in it by the server.
        ("Saving it.", "reasoning_content", f"<tool_call>\n{REPORT}\n</tool_call>\n</think>"),
    ],
)
def test_a_tool_call_inside_the_thinking_ends_the_round_naming_the_server_fix(
    store_url: str,
    scripts: Path,
    server: OpenAIServer,
    content: str | None,
    field: str,
    thinking: str,
) -> None:
    """vLLM's reasoning parser put the call in the thinking and returned no call and no text
    (or only text written after the call), every time it was asked (LLM_MAX_RETRIES=1: asked
    twice). Before, the round took the reply for its final answer and the task went round by
    round to its round limit saying only "the round saved no report" (with text beside the
    call, until this stop); the call never runs."""
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_max_retries=1,
    )
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(content=content, **{field: thinking})
        server.reply(content=content, **{field: thinking})
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "failed"
        assert result.detail is not None
        assert "the model wrote a call of save_report inside its thinking" in result.detail
        assert "vLLM issue #39056" in result.detail
        assert "without --reasoning-parser" in result.detail
        if (content or "").strip():
            assert "only text the model wrote after it (no answer: the call never ran)" in (
                result.detail
            )
        assert len(server.requests) == 3  # asked again once; no more rounds of the same
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "model_error"
        assert view["report"] is None  # the call in the thinking did not run
        assert view["token_usage"]["total"]["calls"] == 2  # the turns recorded
        turns = [e for e in rt.tasks.transcript(task_id)["items"] if e["kind"] == "model_turn"]
        assert turns[-1]["body"]["reasoning_content"] == thinking  # what the model wrote
    finally:
        rt.close()


@pytest.mark.parametrize("content", [None, "Let me save the report."])
def test_a_call_inside_the_thinking_is_asked_again_and_a_proper_call_goes_on(
    store_url: str, scripts: Path, server: OpenAIServer, content: str | None
) -> None:
    """vLLM issue #39056 strikes some replies of a model, not all: the round asks again, and a
    reply that calls the tool as a call goes on. Before (the stop's first version), the first
    such reply failed the task `model_error`; with text beside the call, the round took the
    text for its answer and ended with no report (`continue`) after 1 request."""
    rt, _ = runtime_for(store_url, scripts, model="openai:test-model", llm_base_url=server.base_url)
    try:
        server.reply(content=content, reasoning_content=f"<tool_call>\n{REPORT}\n</tool_call>")
        server.reply(tool_calls=[call("c1", "save_report", json.loads(REPORT)["arguments"])])
        server.reply(content="saved")
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "continue", result.detail
        assert "inside its thinking" not in (result.detail or "")
        # The call ran (the host's rules then refused a completed report citing nothing).
        [answer] = [m for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
        assert answer["tool_call_id"] == "c1"
        assert json.loads(answer["content"])["code"] == "evidence_required"
        assert len(server.requests) == 3
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("content", "thinking"),
    [
        # Thinking that talks about a call is no call.
        (None, "I should call save_report with the summary next."),
        # A model whose thinking goes on past the call it wrote moved on: its text answers.
        (
            "The water is fine.",
            f"<tool_call>\n{REPORT}\n</tool_call>\nNo: the context already says so.",
        ),
        ("The water is fine.", f"[TOOL_CALLS][{REPORT}] but it is not needed."),
    ],
)
def test_thinking_that_is_not_a_lone_call_is_not_taken_for_one(
    store_url: str, scripts: Path, server: OpenAIServer, content: str | None, thinking: str
) -> None:
    rt, _ = runtime_for(store_url, scripts, model="openai:test-model", llm_base_url=server.base_url)
    try:
        server.reply(content=content, reasoning_content=thinking)
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.outcome == "continue"
        assert result.detail is not None
        assert "inside its thinking" not in result.detail
    finally:
        rt.close()
