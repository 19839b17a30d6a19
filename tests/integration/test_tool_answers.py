"""A tool's HTTP answer is bounded in time and size: a backend or a data source that dribbles its
answer, or never ends it, is given up within the call's own `timeout_seconds` (plus at most one
read timeout), and an answer past `MAX_ANSWER_BYTES` is refused before it is held in memory.

Before, httpx's timeout bounded each read, not the call: the dribbled answer held the call for
hours (only the host's ORCH_TOOL_TIMEOUT_SECONDS gave it up, leaving its thread reading), and an
endless answer was read into memory until the worker ran out of it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import ToolCall, ToolContext, ToolResult
from orchestrator.tools.data_sources import QueryArgs, QueryDataSource
from orchestrator.tools.gateway import CallApi
from orchestrator.tools.openapi import parse_spec
from orchestrator.tools.results import ResultCache
from orchestrator.tools.source_declarations import load_sources
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import chat_session

TIMEOUT = 0.5
#: The call's timeout, one read timeout past it, and room for a loaded machine.
BOUND = 2 * TIMEOUT + 2.0


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server


def _bounded(call: Any) -> tuple[Any, float]:
    """Run `call` on a thread: its result and seconds, or fail if it is still running at 30 s
    (before the fix the dribbled answer took hours)."""
    done: list[Any] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert done, "the call was still reading its answer 30 s later"
    return done[0], time.monotonic() - started


def _api(db: Database, backend: Backend, call_id: str, operation_id: str, **arguments: Any) -> Any:
    spec = parse_spec(SPEC)
    cache = ResultCache()
    host = ToolHost(
        [CallApi(spec, backend.url, timeout_seconds=TIMEOUT)],
        ledger=ReceiptLedger(db),
        results=cache,
    )
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    call = ToolCall(call_id, "call_api", {"operation_id": operation_id, "arguments": arguments})
    return host.run_turn(ctx, [call])[0]


def _receipt(db: Database, result: ToolResult) -> str:
    assert result.invocation_id is not None
    receipt = ReceiptLedger(db).get(result.invocation_id)
    assert receipt is not None
    return receipt.status


@pytest.mark.parametrize("mode", ["dribble", "endless"])
def test_a_write_whose_answer_dribbles_or_never_ends_is_unknown_in_time(
    db: Database, backend: Backend, mode: str
) -> None:
    backend.mode["/orders"] = mode
    order = {"item": "valve", "quantity": 2}
    result, seconds = _bounded(lambda: _api(db, backend, "a", "createOrder", body=order))
    assert seconds < BOUND
    # The request was received and answered 200: whether the order holds is not known.
    assert result.status == "unknown"
    assert _receipt(db, result) == "unknown"
    assert backend.count("POST", "/orders") == 1


@pytest.mark.parametrize("mode", ["dribble", "endless"])
def test_a_read_whose_answer_dribbles_or_never_ends_fails_in_time(
    db: Database, backend: Backend, mode: str
) -> None:
    backend.mode["/report"] = mode
    result, seconds = _bounded(lambda: _api(db, backend, "r", "bigReport", size=3))
    assert seconds < BOUND
    assert result.status == "failed"


def test_a_write_whose_headers_dribble_is_unknown_in_time_and_its_connection_closed(
    db: Database, backend: Backend
) -> None:
    """A status line, then the headers a byte every 50 ms: each read is quick, and before the
    headers' own limit the call held its thread for hours (16 KiB of headers)."""
    backend.mode["/orders"] = "dribble_headers"
    order = {"item": "valve", "quantity": 2}
    result, seconds = _bounded(lambda: _api(db, backend, "a", "createOrder", body=order))
    assert seconds < BOUND
    # The request was received; no answer came in time: whether the order holds is not known.
    assert result.status == "unknown"
    assert _receipt(db, result) == "unknown"
    # The connection is shut, not left to a thread reading on: the server's writes fail.
    assert backend.header_dribbles_ended.wait(timeout=5)


def test_a_read_whose_headers_dribble_fails_in_time(db: Database, backend: Backend) -> None:
    backend.mode["/report"] = "dribble_headers"
    result, seconds = _bounded(lambda: _api(db, backend, "r", "bigReport", size=3))
    assert seconds < BOUND
    assert result.status == "failed"
    assert backend.header_dribbles_ended.wait(timeout=5)


def _source(tmp_path: Path, backend: Backend) -> QueryDataSource:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC), encoding="utf-8")
    declaration = tmp_path / "sources.yaml"
    declaration.write_text(
        "sources:\n"
        "  - name: district_report\n"
        "    description: the district report of the business backend\n"
        "    kind: http_json\n"
        "    origin: live\n"
        "    spec: spec.json\n"
        f"    base_url: {backend.url}\n"
        "    operation_id: bigReport\n"
        f"    timeout_seconds: {TIMEOUT}\n",
        encoding="utf-8",
    )
    return QueryDataSource(None, load_sources(declaration))  # type: ignore[arg-type]


def _query(tool: QueryDataSource) -> ToolResult:
    ctx = ToolContext(owner="alice", session_id="s", round_id="r1")
    return tool.run(ctx, QueryArgs(source="district_report", parameters={"size": 3}))


def test_a_source_that_dribbles_its_answer_times_out_in_time(
    tmp_path: Path, backend: Backend
) -> None:
    backend.mode["/report"] = "dribble"
    result, seconds = _bounded(lambda: _query(_source(tmp_path, backend)))
    assert seconds < BOUND
    assert (result.status, result.code) == ("failed", "source_timeout")
    assert f"did not answer within {TIMEOUT} s" in result.message


def test_a_source_whose_headers_dribble_times_out_in_time(tmp_path: Path, backend: Backend) -> None:
    backend.mode["/report"] = "dribble_headers"
    result, seconds = _bounded(lambda: _query(_source(tmp_path, backend)))
    assert seconds < BOUND
    assert (result.status, result.code) == ("failed", "source_timeout")
    assert backend.header_dribbles_ended.wait(timeout=5)


def test_a_source_whose_answer_never_ends_is_refused_past_the_cap(
    tmp_path: Path, backend: Backend
) -> None:
    backend.mode["/report"] = "endless"
    result, seconds = _bounded(lambda: _query(_source(tmp_path, backend)))
    assert seconds < BOUND
    assert (result.status, result.code) == ("failed", "source_error")
    assert "larger than 16 MiB" in result.message


def test_a_source_that_answers_an_error_says_its_status(tmp_path: Path, backend: Backend) -> None:
    tool = _source(tmp_path, backend)
    answered = _query(tool)
    assert answered.status == "succeeded", answered.message
    assert answered.payload["row_count"] == 100
    backend.mode["/report"] = "error"
    result = _query(tool)
    assert (result.status, result.code) == ("failed", "source_error")
    assert result.message == "district_report could not be read: it answered HTTP 503"


def test_a_source_whose_json_starts_with_a_byte_order_mark_is_read(
    tmp_path: Path, backend: Backend
) -> None:
    # JSON in UTF-8 with a BOM (or in UTF-16/32, RFC 8259 readers accept them) was read before
    # the answer was read in chunks (httpx's json() detects the encoding); decoding it as plain
    # UTF-8 turned such a source into source_error.
    backend.mode["/report"] = "bom"
    result = _query(_source(tmp_path, backend))
    assert result.status == "succeeded", result.message
    assert result.payload["row_count"] == 100
