"""The host records evidence for what tools really returned: call_api reads (not sensitive
ones, not writes), commands that exited 0, with its own truncation when it cut a result."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.task_records import TaskRecords
from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for, write_script
from tests.integration.fake_backend import Backend, api_call, gateway_overrides, running_backend


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server


@pytest.fixture
def rt(store_url: str, scripts: Path, tmp_path: Path, backend: Backend) -> Iterator[Runtime]:
    overrides = gateway_overrides(tmp_path, backend, enable_command_tool=True)
    runtime, _ = runtime_for(store_url, scripts, **overrides)
    yield runtime
    runtime.close()


def test_reads_and_successful_commands_become_records_and_nothing_else(
    rt: Runtime, scripts: Path
) -> None:
    turns = [
        {"tool_calls": [api_call("put", "putSetting", key="p", body={"value": 3})]},
        {
            "tool_calls": [
                api_call("get", "getSetting", key="p"),
                api_call("secret", "getSecret", key="db"),
                api_call("big", "bigReport", size=10),
                api_call("order", "createOrder", body={"item": "x", "quantity": 50}),
                {"id": "ok", "name": "execute_command", "arguments": {"command": "echo fine"}},
                {"id": "bad", "name": "execute_command", "arguments": {"command": "exit 3"}},
            ]
        },
        {"content": "looked"},
    ]
    write_script(scripts, "looks", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="looks", title="t")).task.task_id
    rt.executions.run(task_id, 1, worker="w1")
    records = TaskRecords(rt.db).evidence(task_id)["items"]
    by_source = {r["source"]: r for r in records}
    assert set(by_source) == {"call_api:getSetting", "call_api:bigReport", "execute_command"}
    setting = by_source["call_api:getSetting"]
    assert (setting["kind"], setting["origin"], setting["truncated"]) == ("call_api", "live", False)
    # The host cut the big report to a preview: truncated as the host knows it, with its id.
    big = by_source["call_api:bigReport"]
    assert big["truncated"] is True
    assert big["result_id"]
    assert big["char_count"] > 4000
    command = by_source["execute_command"]
    assert (command["kind"], command["truncated"]) == ("command", False)


def test_an_http_json_source_is_bounded_and_recorded_with_its_declared_origin(
    rt: Runtime, scripts: Path, tmp_path: Path, backend: Backend, store_url: str
) -> None:
    spec = tmp_path / "spec.json"  # written by the `rt` fixture
    declaration = tmp_path / "sources.yaml"
    declaration.write_text(
        "sources:\n"
        "  - name: district_report\n"
        "    description: the district report of the business backend\n"
        "    kind: http_json\n"
        "    origin: live\n"
        f"    spec: {spec.name}\n"
        f"    base_url: {backend.url}\n"
        "    operation_id: bigReport\n"
        "    limits: {max_rows: 500, max_chars: 5000}\n",
        encoding="utf-8",
    )
    query = {
        "id": "q",
        "name": "query_data_source",
        "arguments": {"source": "district_report", "parameters": {"size": 10}},
    }
    bad = dict(query, id="bad", arguments={"source": "district_report", "parameters": {"x": 1}})
    write_script(scripts, "http", [{"tool_calls": [query, bad]}, {"content": "read"}])
    runtime, _ = runtime_for(store_url, scripts, data_sources=declaration)
    try:
        task_id = runtime.tasks.trigger(Trigger(task_type="http", title="t")).task.task_id
        runtime.executions.run(task_id, 1, worker="w1")
        [record] = TaskRecords(runtime.db).evidence(task_id)["items"]
    finally:
        runtime.close()
    assert (record["source"], record["origin"], record["kind"]) == (
        "district_report",
        "live",
        "data_source",
    )
    # 100 rows of 100 characters do not fit in 5,000: cut, and the record says so.
    assert record["truncated"] is True
    assert 0 < record["row_count"] < 100
    assert backend.count("GET", "/report") == 1  # the invalid query was never sent


@pytest.mark.parametrize("mode", ["paged", "counted"])
def test_a_page_of_a_longer_answer_is_recorded_truncated(
    rt: Runtime, scripts: Path, tmp_path: Path, backend: Backend, store_url: str, mode: str
) -> None:
    """A source that sends its first page (a cursor to the next, or a total above what it
    sent) answered for part of the range: its record is truncated, so a finding cannot claim
    the whole range on it; the same for a business backend read through call_api."""
    backend.mode["/report"] = mode
    declaration = tmp_path / "sources.yaml"
    declaration.write_text(
        "sources:\n"
        "  - name: district_report\n"
        "    description: the district report of the business backend\n"
        "    kind: http_json\n"
        "    origin: live\n"
        "    spec: spec.json\n"
        f"    base_url: {backend.url}\n"
        "    operation_id: bigReport\n",
        encoding="utf-8",
    )
    query = {
        "id": "q",
        "name": "query_data_source",
        "arguments": {"source": "district_report", "parameters": {"size": 10}},
    }
    read = api_call("read", "bigReport", size=10)
    write_script(scripts, "pages", [{"tool_calls": [query, read]}, {"content": "read"}])
    runtime, _ = runtime_for(
        store_url, scripts, data_sources=declaration, **gateway_overrides(tmp_path, backend)
    )
    try:
        task_id = runtime.tasks.trigger(Trigger(task_type="pages", title="t")).task.task_id
        runtime.executions.run(task_id, 1, worker="w1")
        records = TaskRecords(runtime.db).evidence(task_id)["items"]
        shown = [
            e["body"]
            for e in runtime.tasks.transcript(task_id)["items"]
            if e["kind"] == "tool_result" and e["call_id"] == "q"
        ]
    finally:
        runtime.close()
    by_source = {r["source"]: r for r in records}
    assert set(by_source) == {"district_report", "call_api:bigReport"}
    assert by_source["district_report"]["truncated"] is True
    assert by_source["district_report"]["row_count"] == 10
    assert by_source["call_api:bigReport"]["truncated"] is True
    # The model is told why, in the result it is shown.
    [body] = shown
    assert "only part of the range" in json.dumps(body)


def test_a_command_record_says_the_command_line_clipped_and_never_its_env(
    rt: Runtime, scripts: Path
) -> None:
    """The record kept only a digest of the command, so an operator could not see that a
    `live` record came from `echo 'no anomaly'`: its summary says the line (never `env`)."""
    long = "echo " + "a" * 400
    run = {"command": "echo 'no anomaly'", "env": {"PROBE_TOKEN": "s3cret-probe-value"}}
    turns = [
        {
            "tool_calls": [
                {"id": "said", "name": "execute_command", "arguments": run},
                {"id": "long", "name": "execute_command", "arguments": {"command": long}},
                {
                    "id": "bg",
                    "name": "execute_command",
                    "arguments": {"action": "start", "command": "echo two\necho lines"},
                },
            ]
        },
        {
            "tool_calls": [
                {
                    "id": "w",
                    "name": "execute_command",
                    "arguments": {"action": "wait", "process_id": "${bg.result.process_id}"},
                }
            ]
        },
        {"content": "looked"},
    ]
    write_script(scripts, "looks", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="looks", title="t")).task.task_id
    rt.executions.run(task_id, 1, worker="w1")
    summaries = [r["summary"] for r in TaskRecords(rt.db).evidence(task_id)["items"]]
    assert len(summaries) == 3, summaries
    assert any("`echo 'no anomaly'`" in summary for summary in summaries), summaries
    said, clipped, waited = (
        next(s for s in summaries if part in s) for part in ("anomaly", "aaaa", "lines")
    )
    assert said.startswith("command execute_command `echo 'no anomaly'`: ")
    assert "s3cret-probe-value" not in json.dumps(summaries)
    assert f"`{long[:200]}... (405 characters)`" in clipped
    # A wait names its process; the record says the command that process ran, on one line.
    assert "`echo two echo lines`" in waited
