"""Tool discovery: the catalogue, `search_tools`, the alias table and the seed's budgets."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.agent.brief import task_brief, task_topic
from orchestrator.agent.budget import ContextBudget, ContextOverflow, TokenCounter
from orchestrator.agent.catalogue import (
    DISCOVERY,
    INTERNAL_TOOLS,
    Catalogue,
    Discovery,
    SearchTools,
    external_tools,
)
from orchestrator.agent.model import ScriptedModel
from orchestrator.agent.request import AgentContext, RequestBuilder
from orchestrator.agent.search_scores import ALIASES
from orchestrator.agent.subagents import Delegate
from orchestrator.api.app import INTERNAL_ROUTERS
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.command import ExecuteCommand
from orchestrator.tools.gateway import CallApi, DescribeApiOperation
from orchestrator.tools.invocations import GetToolExecution
from orchestrator.tools.openapi import parse_spec
from orchestrator.tools.results import ReadToolResult, ResultCache
from orchestrator.tools.tasks import ReadTaskContext


def operation(
    op_id: str, summary: str, tags: list[str], *, method: str = "get", big: int = 0, **extra: Any
) -> tuple[str, str, dict[str, Any]]:
    body: dict[str, Any] = {"operationId": op_id, "summary": summary, "tags": tags, **extra}
    if big:
        body["parameters"] = [
            {
                "name": f"p{k}",
                "in": "query",
                "description": "a filter on the readings " * 3,
                "schema": {"type": "string"},
            }
            for k in range(big)
        ]
    return f"/{op_id}", method, body


def spec(*operations: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, method, body in operations:
        paths.setdefault(path, {})[method] = body
    return {"openapi": "3.0.3", "info": {"title": "utility backend"}, "paths": paths}


BUSINESS = spec(
    operation("transferFiles", "Transfer downloaded files into the library", ["transfer"]),
    operation(
        "createWorkOrder", "Open a work order for a field crew", ["work order"], method="post"
    ),
    operation("listSamplingPoints", "List the sampling points of a district", ["sampling"]),
    operation("getWaterQuality", "Latest water quality readings of a station", ["quality"]),
    operation("getPressure", "Pressure readings of a district meter", ["pressure", "telemetry"]),
    operation("putSetting", "Replace a controller setting", ["settings"], method="put"),
    operation("getSecretKey", "Read a secret key", ["settings"], **{"x-effect": "sensitive_read"}),
)


def tools_for(document: dict[str, Any]) -> dict[str, Tool]:
    api = CallApi(parse_spec(document), "http://127.0.0.1:9")
    tools: list[Tool] = [
        ReadTaskContext.__new__(ReadTaskContext),
        SearchTools(),
        ReadToolResult(ResultCache()),
        GetToolExecution.__new__(GetToolExecution),
        Delegate(),
        api,
        DescribeApiOperation(api.spec),
        ExecuteCommand(),
    ]
    return {tool.name: tool for tool in tools}


@pytest.fixture
def catalogue() -> Catalogue:
    return Catalogue(tools_for(BUSINESS))


def names(entries: list[Any]) -> list[str]:
    return [entry.name for entry in entries]


def test_every_operation_is_its_own_entry_and_resident_tools_are_not(catalogue: Catalogue) -> None:
    assert set(catalogue.entries) == {
        "transferFiles",
        "createWorkOrder",
        "listSamplingPoints",
        "getWaterQuality",
        "getPressure",
        "putSetting",
        "getSecretKey",
        "describe_api_operation",
        "execute_command",
    }
    assert catalogue.resident == [
        "read_task_context",
        "search_tools",
        "read_tool_result",
        "get_tool_execution",
        "delegate",
    ]


def test_exact_name_description_words_and_tags(catalogue: Catalogue) -> None:
    assert names(catalogue.search("getPressure"))[0] == "getPressure"
    assert names(catalogue.search("execute_command")) == ["execute_command"]
    assert names(catalogue.search("district meter readings"))[0] == "getPressure"
    assert names(catalogue.search("telemetry")) == ["getPressure"]


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("整理", "transferFiles"),
        ("工单", "createWorkOrder"),
        ("采样", "listSamplingPoints"),
        ("水质", "getWaterQuality"),
        ("查看水质数据", "getWaterQuality"),
        ("压力", "getPressure"),
    ],
)
def test_the_zh_en_alias_table(catalogue: Catalogue, query: str, first: str) -> None:
    assert names(catalogue.search(query))[0] == first


def test_the_alias_table_has_the_seed_examples() -> None:
    assert "transfer" in ALIASES["整理"]
    assert "work order" in ALIASES["工单"]
    assert "sampling" in ALIASES["采样"]
    assert "water quality" in ALIASES["水质"]


def test_no_match_returns_none_never_the_whole_catalogue(catalogue: Catalogue) -> None:
    assert catalogue.search("zebra crossing") == []
    assert catalogue.search("的") == []
    discovery = Discovery(catalogue, ContextBudget(100_000, max_tools=3), TokenCounter(), brief="x")
    assert discovery.discover("zebra") == []
    tools, notice = discovery.offer()
    assert notice is None
    assert [t["name"] for t in tools] == catalogue.resident


def sensors(count: int, big: int = 0) -> Catalogue:
    return Catalogue(
        tools_for(
            spec(
                *(
                    operation(f"sensor{k:02d}", f"Readings of sensor {k}", ["sensor"], big=big)
                    for k in range(count)
                )
            )
        )
    )


def test_limit_defaults_to_5_and_is_at_most_8() -> None:
    catalogue = sensors(20)
    assert len(catalogue.search("sensor")) == 5
    assert len(catalogue.search("sensor", limit=8)) == 8
    assert len(catalogue.search("sensor", limit=20)) == 8
    assert len(catalogue.search("sensor", limit=2)) == 2


def test_the_16_most_recent_candidates_are_kept_and_a_discovery_refreshes_priority() -> None:
    catalogue = sensors(20)
    discovery = Discovery(catalogue, ContextBudget(100_000, max_tools=1), TokenCounter(), brief="")
    for k in range(20):
        discovery.discover(f"sensor{k:02d}", limit=1)
    assert list(discovery.candidates) == [f"sensor{k:02d}" for k in range(4, 20)]
    assert len(discovery.candidates) == 16
    discovery.discover("sensor04", limit=1)  # found again: now the most recent
    assert list(discovery.candidates)[-1] == "sensor04"
    discovery.discover("sensor00", limit=1)  # a 17th: the oldest (sensor05) goes
    assert "sensor05" not in discovery.candidates
    assert len(discovery.candidates) == 16


@pytest.mark.parametrize(("window", "budget"), [(100_000, 4096), (20_000, 2000)])
def test_extra_tools_stay_within_min_of_4096_tokens_and_10_percent(
    window: int, budget: int
) -> None:
    catalogue = sensors(16, big=6)
    counter = TokenCounter()
    discovery = Discovery(catalogue, ContextBudget(window, max_tools=1), counter, brief="")
    for k in range(16):
        discovery.discover(f"sensor{k:02d}", limit=1)
    tools, notice = discovery.offer()
    offer = discovery.last
    assert offer is not None
    assert offer.budget_tokens == budget
    extra = tools[len(catalogue.resident) :]
    measured = sum(counter.schema(schema) for schema in extra)
    assert offer.extra_tokens == measured <= budget
    assert offer.enabled
    assert offer.refused
    # One more (the best refused candidate) would have gone over the budget.
    one_more = catalogue.extra_schemas([*offer.enabled, offer.refused[0][0]])
    assert sum(counter.schema(schema) for schema in one_more) > budget
    # The most recent discoveries come first; the report says what was not enabled and why.
    assert offer.enabled[0] == "sensor15"
    assert notice is not None
    assert "Not enabled: " in notice
    assert "-token extra-tool budget" in notice
    # call_api lists exactly the enabled operations.
    (call_api,) = [t for t in extra if t["name"] == "call_api"]
    assert call_api["parameters"]["properties"]["operation_id"]["enum"] == list(offer.enabled)
    # The notice comes once, on the call after a search.
    assert discovery.offer()[1] is None


def test_the_first_call_gets_at_most_llm_max_tools_selected_for_the_task(
    catalogue: Catalogue,
) -> None:
    budget = ContextBudget(100_000, max_tools=2)
    discovery = Discovery(
        catalogue, budget, TokenCounter(), brief="Condition task t (quality): 水质 pressure drop"
    )
    assert set(discovery.initial) == {"getWaterQuality", "getPressure"}
    tools, notice = discovery.offer()
    assert notice is None
    assert [t["name"] for t in tools] == [*catalogue.resident, "call_api"]
    none = Discovery(catalogue, budget, TokenCounter(), brief="Condition task t (misc): odd")
    assert none.initial == []


def test_discovery_never_grants_a_read_only_caller_a_write(catalogue: Catalogue) -> None:
    readonly = Discovery(
        catalogue, ContextBudget(100_000, max_tools=8), TokenCounter(), brief="", readonly=True
    )
    assert names(readonly.discover("setting")) == []  # putSetting (write) is not found
    assert names(readonly.discover("secret key")) == []  # sensitive_read neither
    assert names(readonly.discover("工单")) == []
    assert names(readonly.discover("pressure")) == ["getPressure"]
    tools, _ = readonly.offer()
    assert [t["name"] for t in tools] == [
        "read_task_context",
        "search_tools",
        "read_tool_result",
        "get_tool_execution",
        "call_api",
    ]


def test_a_read_marked_x_sensitive_is_not_found_by_a_read_only_caller() -> None:
    """Seed 000: a sensitive setting's original value is not for a sub-agent, so its discovery
    does not offer it (the host refuses it anyway), nor the hint of what it may call."""
    document = spec(
        operation("getPressure", "Pressure readings of a district meter", ["pressure"]),
        operation("getApiKey", "Read the API key setting", ["key"], **{"x-sensitive": True}),
    )
    tools = tools_for(document)
    catalogue = Catalogue(tools)
    readonly = Discovery(
        catalogue, ContextBudget(100_000, max_tools=8), TokenCounter(), brief="", readonly=True
    )
    assert names(readonly.discover("key")) == []
    assert names(catalogue.search("key")) == ["getApiKey"]  # the main agent finds it
    hint = tools["call_api"].read_uses()
    assert hint is not None
    assert "getPressure" in hint
    assert "getApiKey" not in hint


def test_search_tools_reports_candidates_and_is_off_without_discovery(
    catalogue: Catalogue,
) -> None:
    tool = SearchTools()
    ctx = ToolContext(owner="o", session_id="s", round_id="r")
    off = tool.run(ctx, tool.arguments(search="pressure"))
    assert (off.status, off.code) == ("failed", "discovery_off")
    discovery = Discovery(catalogue, ContextBudget(100_000, max_tools=1), TokenCounter(), brief="")
    ctx = ToolContext(owner="o", session_id="s", round_id="r", extras={DISCOVERY: discovery})
    found = tool.run(ctx, tool.arguments(search="水质", limit=20))
    assert found.status == "succeeded"
    assert found.payload["limit"] == 8
    assert found.payload["candidates"][0]["name"] == "getWaterQuality"
    assert found.payload["candidates"][0]["call"] == "call_api(operation_id='getWaterQuality')"
    nothing = tool.run(ctx, tool.arguments(search="zebra"))
    assert nothing.payload == {
        "candidates": [],
        "limit": 5,
        "note": "no tool matches; nothing was added",
    }


def _builder(brief: str, budget: ContextBudget, counter: TokenCounter) -> RequestBuilder:
    tools = tools_for(BUSINESS)
    return RequestBuilder(
        ScriptedModel([]),
        tools,
        [tool.schema() for tool in tools.values()],
        ToolContext(owner="o", session_id="s", round_id="r"),
        system="s",
        brief=brief,
        stop=threading.Event(),
        context=AgentContext(budget, counter),
    )


def _padded(
    brief: str, budget: ContextBudget, counter: TokenCounter, tools: Any, slack: int
) -> str:
    base = counter.raw(
        [{"role": "system", "content": "s"}, {"role": "user", "content": brief}], tools
    )
    return brief + " lorem" * (budget.request_limit - base - slack)


def test_discovered_tools_give_way_to_the_request_margin_the_initial_selection_stays(
    catalogue: Catalogue,
) -> None:
    counter = TokenCounter()
    budget = ContextBudget(4000, 200, max_tools=1)
    # Room for the resident tools, the initial selection and the notice, not for one more.
    kept = [*catalogue.resident_schemas(), *catalogue.extra_schemas(["getWaterQuality"])]
    builder = _builder(_padded("water quality", budget, counter, kept, 80), budget, counter)
    assert builder.discovery is not None
    assert builder.discovery.initial == ["getWaterQuality"]
    assert names(builder.discovery.discover("pressure")) == ["getPressure"]
    messages, sent = builder.build()
    (call_api,) = [t for t in sent if t["name"] == "call_api"]
    assert call_api["parameters"]["properties"]["operation_id"]["enum"] == ["getWaterQuality"]
    assert (
        "Not enabled: getPressure (the request would not keep its 15 % margin"
        in messages[-1]["content"]
    )
    assert counter.raw(messages, sent) <= budget.request_limit


def test_an_initial_selection_that_cannot_fit_is_a_context_overflow_not_dropped(
    catalogue: Catalogue,
) -> None:
    counter = TokenCounter()
    budget = ContextBudget(4000, 200, max_tools=2)
    # Room for the resident tools only: the initial selection is not silently left out.
    brief = _padded("water quality pressure", budget, counter, catalogue.resident_schemas(), 30)
    builder = _builder(brief, budget, counter)
    assert builder.discovery is not None
    assert set(builder.discovery.initial) == {"getWaterQuality", "getPressure"}
    with pytest.raises(ContextOverflow, match="nothing was dropped"):
        builder.build()


def test_internal_tools_are_never_offered_outside() -> None:
    assert {"search_tools", "read_tool_result", "get_tool_execution"} == INTERNAL_TOOLS
    tools = list(tools_for(BUSINESS).values())
    assert {tool.name for tool in external_tools(tools)} & INTERNAL_TOOLS == set()
    paths = [getattr(route, "path", "") for router in INTERNAL_ROUTERS for route in router.routes]
    assert paths
    for path in paths:
        for name in INTERNAL_TOOLS:
            assert name not in path


def test_a_new_round_selects_afresh(catalogue: Catalogue) -> None:
    budget = ContextBudget(100_000, max_tools=1)
    first = Discovery(catalogue, budget, TokenCounter(), brief="odd")
    first.discover("工单")
    assert list(first.candidates) == ["createWorkOrder"]
    again = Discovery(catalogue, budget, TokenCounter(), brief="odd")
    assert list(again.candidates) == []
    tools, _ = again.offer()
    assert [t["name"] for t in tools] == catalogue.resident


def test_the_initial_selection_stays_available_and_the_budget_is_for_discovered_tools() -> None:
    """Seed 000: the discovered (额外) tools share min(4096 tokens, 10 %); the initial selection
    (初选), like the resident tools, stays available and takes nothing from that budget."""
    catalogue = sensors(32, big=6)
    counter = TokenCounter()
    budget = ContextBudget(100_000, max_tools=16)
    discovery = Discovery(catalogue, budget, counter, brief="sensor readings")
    initial = [f"sensor{k:02d}" for k in range(16)]
    assert discovery.initial == initial
    initial_cost = sum(counter.schema(s) for s in catalogue.extra_schemas(initial))
    assert initial_cost > budget.extra_tools_tokens  # more than the whole extra-tool budget
    tools, notice = discovery.offer()
    offer = discovery.last
    assert offer is not None
    assert offer.enabled == tuple(initial)
    assert (offer.refused, offer.extra_tokens, notice) == ((), 0, None)
    (call_api,) = [t for t in tools if t["name"] == "call_api"]
    assert call_api["parameters"]["properties"]["operation_id"]["enum"] == initial
    # Discovered candidates get the whole budget beside the initial selection.
    for k in range(16, 32):
        discovery.discover(f"sensor{k:02d}", limit=1)
    tools, notice = discovery.offer()
    offer = discovery.last
    assert offer is not None
    assert offer.enabled[:16] == tuple(initial)
    found = offer.enabled[16:]
    assert found[0] == "sensor31"
    assert len(found) >= 8
    left_out = [f"sensor{k:02d}" for k in range(16, 32 - len(found))]
    assert [name for name, _ in offer.refused] == left_out
    everything = sum(counter.schema(s) for s in catalogue.extra_schemas(offer.enabled))
    assert offer.extra_tokens == everything - initial_cost
    assert offer.extra_tokens <= budget.extra_tools_tokens
    assert notice is not None
    assert "Not enabled: sensor16" in notice


def test_the_initial_selection_follows_the_task_not_the_context_in_its_brief() -> None:
    # The brief carries the business backend's context (seed 004); the tools chosen for the
    # round follow the task's type and title (`topic`), so the context cannot pick them.
    budget = ContextBudget(100_000, max_tools=2)
    brief = task_brief("t", "quality", "水质", 1, {"ask": "createWorkOrder transfer 工单"})
    tools = tools_for(BUSINESS)
    builder = RequestBuilder(
        ScriptedModel([]),
        tools,
        [tool.schema() for tool in tools.values()],
        ToolContext(owner="o", session_id="s", round_id="r"),
        system="s",
        brief=brief,
        topic=task_topic("t", "quality", "水质"),
        stop=threading.Event(),
        context=AgentContext(budget, TokenCounter()),
    )
    assert builder.discovery is not None
    assert builder.discovery.initial == ["getWaterQuality"]
    messages, _ = builder.build()
    assert messages[1]["content"] == brief


def test_a_round_measures_the_resident_definitions_once(
    catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call of a round offers the same resident definitions: they are rendered once and
    measured once, not once per call."""
    from orchestrator.agent.compaction import Conversation

    counter = TokenCounter()
    measured: list[str] = []
    original = counter.schema
    monkeypatch.setattr(counter, "schema", lambda s: measured.append(s["name"]) or original(s))
    discovery = Discovery(catalogue, ContextBudget(100_000, max_tools=3), counter, brief="odd")
    convo = Conversation(system="s", brief="b", budget=ContextBudget(100_000), counter=counter)
    for _ in range(3):
        convo.prepare(discovery.offer()[0])
    assert sorted(measured) == sorted(catalogue.resident)
    # A discovered tool changes the set: it is measured again, the new definition included.
    discovery.discover("pressure")
    tools, _ = discovery.offer()
    measured.clear()
    convo.prepare(tools)
    assert measured == [t["name"] for t in tools]
    assert measured[-1] == "call_api"


def test_the_kept_resident_definitions_follow_the_caller(catalogue: Catalogue) -> None:
    """Read-only and full callers each get their own list, kept apart; a caller changing the
    list it got changes nothing for the next."""
    readonly = catalogue.resident_schemas(readonly=True)
    full = catalogue.resident_schemas()
    assert [t["name"] for t in full] == catalogue.resident
    assert "delegate" not in [t["name"] for t in readonly]
    assert "delegate" in [t["name"] for t in full]
    readonly.clear()
    assert catalogue.resident_schemas(readonly=True) != []
    assert catalogue.resident_schemas(readonly=True) == catalogue.resident_schemas(readonly=True)
