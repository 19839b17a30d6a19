"""The context budget's numbers (seed 000) and the calibrated offline token counter."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.agent.budget import (
    CANDIDATES_KEPT,
    SEARCH_LIMIT_DEFAULT,
    SEARCH_LIMIT_MAX,
    ContextBudget,
    TokenCounter,
    prompt_tokens_of,
)
from orchestrator.settings import SettingsError, load_settings


def test_the_seed_numbers() -> None:
    assert (SEARCH_LIMIT_DEFAULT, SEARCH_LIMIT_MAX, CANDIDATES_KEPT) == (5, 8, 16)


@pytest.mark.parametrize(
    ("window", "extra"),
    [(100_000, 4096), (40_960, 4096), (40_000, 4000), (20_000, 2000), (8_192, 819)],
)
def test_extra_tools_share_min_of_4096_tokens_and_10_percent(window: int, extra: int) -> None:
    assert ContextBudget(window).extra_tools_tokens == extra


@pytest.mark.parametrize(
    ("window", "max_output", "limit"),
    [
        (10_000, None, 8_500),  # 15 % margin
        (10_000, 1_000, 8_500),  # the margin already covers the output
        (10_000, 2_000, 8_000),  # a larger output reservation wins
        (32_768, 4_096, 27_852),
    ],
)
def test_the_request_keeps_a_15_percent_margin(
    window: int, max_output: int | None, limit: int
) -> None:
    budget = ContextBudget(window, max_output)
    assert budget.request_limit == limit
    assert budget.compact_target == min(limit, int(window * 0.6))


def test_the_counter_counts_offline_and_caches() -> None:
    counter = TokenCounter()
    assert counter.text("hello world") == 2
    assert counter.text("水质采样") > 0
    message = {"role": "user", "content": "hello world"}
    assert counter.message(message) > counter.text("hello world")
    assert counter.raw([message], []) == counter.message(message) + 3
    assert counter.truncate("one two three four five", 2) == "one two"


def test_calibration_scales_counts_within_bounds() -> None:
    counter = TokenCounter()
    counter.calibrate(1000, 1250)
    assert counter.ratio == 1.25
    assert counter.scaled(100) == 125
    counter.calibrate(1000, 1_000_000)  # nonsense is bounded
    assert counter.ratio == 4.0
    counter.calibrate(0, 10)  # ignored
    assert counter.ratio == 4.0


def test_reported_usage_is_read_from_objects_and_mappings() -> None:
    class Usage:
        prompt_tokens = 42

    assert prompt_tokens_of(Usage()) == 42
    assert prompt_tokens_of({"prompt_tokens": 7, "completion_tokens": 3}) == 7
    assert prompt_tokens_of(None) is None
    assert prompt_tokens_of({"prompt_tokens": True}) is None


def test_the_settings_use_the_issue_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "16000")
    monkeypatch.setenv("LLM_MAX_OUTPUT_TOKENS", "2000")
    monkeypatch.setenv("LLM_MAX_TOOLS", "6")
    settings = load_settings(database_url=None)
    assert (settings.llm_context_window, settings.llm_max_output_tokens) == (16000, 2000)
    assert settings.llm_max_tools == 6
    monkeypatch.setenv("LLM_MAX_OUTPUT_TOKENS", "16000")
    with pytest.raises(SettingsError, match="LLM_MAX_OUTPUT_TOKENS"):
        load_settings(database_url=None)
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "12")
    with pytest.raises(SettingsError, match="invalid setting LLM_CONTEXT_WINDOW"):
        load_settings(database_url=None)


@pytest.mark.parametrize(
    "content",
    [
        "hello world",
        "水质采样 DM-RN-01 浊度 0.42 NTU",
        '{"readings": [1.25, 2.5], "unit": "NTU"}',
        "",
    ],
)
def test_the_byte_bound_is_never_below_the_count(content: str) -> None:
    """A request whose bound fits is sent without tokenizing it, so the bound must be safe."""
    counter = TokenCounter()
    message = {"role": "tool", "tool_call_id": "c1", "content": content}
    tools = [{"type": "function", "function": {"name": "save_report", "parameters": {}}}]
    bound = counter.raw_bound([message], tools)
    assert counter.message_bound(message) >= counter.message(message)
    assert bound >= counter.raw([message], tools)
    # Once counted, the bound is the exact count.
    assert counter.raw_bound([message], tools) == counter.raw([message], tools)


def test_a_request_within_its_bound_is_not_tokenized(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.agent.compaction import Conversation

    counter = TokenCounter()
    convo = Conversation(system="sys", brief="brief", budget=ContextBudget(8_192), counter=counter)
    convo.add_assistant({"role": "assistant", "content": "let me look " * 50})
    encoded: list[str] = []
    original = counter.text
    monkeypatch.setattr(counter, "text", lambda text: encoded.append(text) or original(text))
    messages = convo.prepare([])
    assert encoded == []  # fitted by its bound alone
    assert convo.last_raw == counter.raw(messages, [])  # exact when calibration asks


def test_a_role_and_content_message_is_serialised_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system prompt, brief and plan go into every request of every round: their JSON text
    is written once per counter, not once per call."""
    from orchestrator.agent import budget

    counter = TokenCounter()
    dumped: list[object] = []
    original = budget._dump
    monkeypatch.setattr(budget, "_dump", lambda value: dumped.append(value) or original(value))
    system = {"role": "system", "content": "You investigate a condition task. " * 20}
    first = counter.message_bound(system)
    assert counter.message_bound(dict(system)) == first
    assert counter.message(dict(system)) == counter.message(system)
    assert len(dumped) == 1


@pytest.mark.parametrize(
    "other",
    [
        {"role": "user", "content": "the plan, version 2"},  # another content
        {"role": "system", "content": "the plan, version 1"},  # another role
        {"role": "user", "content": "the plan, version 1", "name": "planner"},  # another key
        {"role": "user", "content": ["the plan, version 1"]},  # not a string: never kept
    ],
)
def test_a_kept_message_text_is_never_served_for_another_message(other: dict[str, Any]) -> None:
    counter = TokenCounter()
    fresh = TokenCounter()
    counter.message_bound({"role": "user", "content": "the plan, version 1"})
    counter.message({"role": "user", "content": "the plan, version 1"})
    assert counter.message_bound(other) == fresh.message_bound(other)
    assert counter.message(other) == fresh.message(other)


def test_a_kept_message_bound_becomes_exact_once_the_message_is_counted() -> None:
    """Only the text is kept, not the bound: once the exact count is known (calibration
    counted the request) the bound is that count, as before."""
    counter = TokenCounter()
    message = {"role": "user", "content": "水质采样 DM-RN-01 浊度 0.42 NTU " * 10}
    by_bytes = counter.message_bound(message)
    exact = counter.message(message)
    assert exact < by_bytes
    assert counter.message_bound(message) == exact


def test_a_tools_definition_is_serialised_once_per_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request of every round measures the same tool definitions: `Tool.schema()` makes a
    new dict each time around the argument model's one cached schema, and its JSON text is
    written once per counter, not once per request."""
    from orchestrator.agent import budget
    from orchestrator.tools.tasks import SaveReport

    counter = TokenCounter()
    dumped: list[object] = []
    original = budget._dump
    monkeypatch.setattr(budget, "_dump", lambda value: dumped.append(value) or original(value))
    tool = SaveReport.__new__(SaveReport)
    first = counter.schema(tool.schema())
    assert [counter.schema(tool.schema()) for _ in range(3)] == [first] * 3
    assert len(dumped) == 1
    assert first == TokenCounter().text(original(tool.schema()))


@pytest.mark.parametrize(
    "other",
    [
        # The same name and description around other parameters (a discovered operation).
        {"name": "save_report", "description": "Save the report.", "parameters": "other"},
        {"name": "save_report", "description": "Save it.", "parameters": None},  # another text
        {"name": "save_it", "description": "Save the report.", "parameters": None},  # another name
        {"name": "save_report", "description": "Save the report.", "parameters": None, "x": 1},
    ],
)
def test_a_kept_tool_count_is_never_served_for_another_definition(other: dict[str, Any]) -> None:
    """The count is kept for the very parameters object it measured, with the same name and
    description: other parameters under the same name, another text or another key are
    measured anew."""
    parameters = {"type": "object", "properties": {"summary": {"type": "string"}}}
    kept = {"name": "save_report", "description": "Save the report.", "parameters": parameters}
    counter = TokenCounter()
    counter.schema(kept)
    if other["parameters"] == "other":
        other = {**other, "parameters": {"type": "object", "properties": {}}}
    else:
        other = {**other, "parameters": parameters}
    assert counter.schema(other) == TokenCounter().schema(other)
    assert counter.schema(kept) == TokenCounter().schema(kept)
