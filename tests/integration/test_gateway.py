"""`call_api` through the tool host against a local backend that counts requests."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import ToolCall, ToolContext, ToolResult
from orchestrator.tools.gateway import CallApi, DescribeApiOperation
from orchestrator.tools.openapi import parse_spec
from orchestrator.tools.results import ReadToolResult, ResultCache
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import chat_session, running_task, supersede
from tests.services import refused_port


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server


def _host(
    db: Database, base_url: str, timeout: float = 5.0, document: dict[str, Any] | None = None
) -> ToolHost:
    spec = parse_spec(SPEC if document is None else document)
    cache = ResultCache()
    tools = [
        CallApi(spec, base_url, timeout_seconds=timeout),
        DescribeApiOperation(spec),
        ReadToolResult(cache),
    ]
    return ToolHost(tools, ledger=ReceiptLedger(db), results=cache)


def _call(call_id: str, operation_id: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, "call_api", {"operation_id": operation_id, "arguments": arguments})


def _put(call_id: str, value: Any = 5) -> ToolCall:
    return _call(call_id, "putSetting", key="pressure", body={"value": value})


def _receipt_status(db: Database, result: ToolResult) -> str:
    assert result.invocation_id is not None
    receipt = ReceiptLedger(db).get(result.invocation_id)
    assert receipt is not None
    return receipt.status


def test_three_identical_parallel_writes_send_one_request(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    # "5" and 5 are one intent once the schema has coerced the type.
    results = host.run_turn(ctx, [_put("a"), _put("b", "5"), _put("c")])
    assert backend.count("PUT", "/settings/pressure") == 1
    assert [r.status for r in results] == ["succeeded"] * 3
    assert len({r.invocation_id for r in results}) == 1
    assert _receipt_status(db, results[0]) == "succeeded"
    # The same intent later in the same round is not sent again either.
    again = host.run_turn(ctx, [_put("d")])
    assert again[0].status == "succeeded"
    assert again[0].invocation_id == results[0].invocation_id
    assert backend.count("PUT", "/settings/pressure") == 1
    # A new round (a new user request) may run a finished write again.
    next_round = ToolContext(owner="alice", session_id=ctx.session_id, round_id="r2")
    assert host.run_turn(next_round, [_put("e")])[0].status == "succeeded"
    assert backend.count("PUT", "/settings/pressure") == 2


def test_a_4xx_is_failed_and_the_business_error_field_is_not_the_status(
    db: Database, backend: Backend
) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    rejected, created = host.run_turn(
        ctx,
        [
            _call("a", "createOrder", body={"item": "pump", "quantity": 50}),
            _call("b", "createOrder", body={"item": "pump", "quantity": "2"}),
        ],
    )
    assert rejected.status == "failed"
    assert rejected.payload["http_status"] == 422
    assert _receipt_status(db, rejected) == "failed"
    assert created.status == "succeeded"  # its body has an "error" field: business data only
    assert created.payload["body"]["error"] == "this field is business data"
    assert backend.count("POST", "/orders") == 2


def test_invalid_arguments_send_nothing_and_claim_nothing(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    results = host.run_turn(
        ctx,
        [
            _call("a", "createOrder", body={"item": "", "quantity": 1}),
            _call("b", "createOrder", body={"item": "x", "quantity": 1, "colour": "red"}),
            _call("c", "noSuchOperation"),
            _call("d", "putSetting", key="pressure", body={"value": float("nan")}),
        ],
    )
    assert [r.status for r in results] == ["failed"] * 4
    assert all(r.code == "invalid_arguments" for r in results)
    assert sum(backend.requests.values()) == 0
    assert ReceiptLedger(db).list_for_owner("alice") == []


def test_a_dropped_connection_after_sending_is_unknown(db: Database, backend: Backend) -> None:
    backend.mode["/orders"] = "drop"
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    result = host.run_turn(ctx, [_call("a", "createOrder", body={"item": "x", "quantity": 1})])[0]
    assert result.status == "unknown"
    assert _receipt_status(db, result) == "unknown"
    assert backend.count("POST", "/orders") == 1
    # A later round does not send it again: no verifier for a list append, it stays unknown.
    later = ToolContext(owner="alice", session_id=ctx.session_id, round_id="r2")
    again = host.run_turn(later, [_call("b", "createOrder", body={"item": "x", "quantity": 1})])
    assert again[0].status == "unknown"
    assert again[0].code == "verify_first"
    assert again[0].invocation_id == result.invocation_id
    assert backend.count("POST", "/orders") == 1


def test_a_timeout_after_sending_is_unknown(db: Database, backend: Backend) -> None:
    backend.mode["/settings/pressure"] = "slow"
    host = _host(db, backend.url, timeout=0.3)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    result = host.run_turn(ctx, [_put("a")])[0]
    assert result.status == "unknown"
    assert _receipt_status(db, result) == "unknown"


def test_nothing_listening_is_failed_not_unknown(db: Database) -> None:
    host = _host(db, f"http://127.0.0.1:{refused_port()}")
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    result = host.run_turn(ctx, [_put("a")])[0]
    assert result.status == "failed"
    assert _receipt_status(db, result) == "failed"


def test_read_back_turns_unknown_into_succeeded_without_resending(
    db: Database, backend: Backend
) -> None:
    backend.mode["/settings/pressure"] = "drop"  # applied, then the answer is lost
    host = _host(db, backend.url)
    session_id = chat_session(db)
    first = host.run_turn(ToolContext("alice", session_id, "r1"), [_put("a", 7)])[0]
    assert first.status == "unknown"
    backend.mode["/settings/pressure"] = "ok"
    second = host.run_turn(ToolContext("alice", session_id, "r2"), [_put("b", 7)])[0]
    assert second.status == "succeeded"
    assert second.code == "verified"
    assert second.invocation_id == first.invocation_id
    assert _receipt_status(db, first) == "succeeded"
    assert backend.count("PUT", "/settings/pressure") == 1
    assert backend.count("GET", "/settings/pressure") == 1


def test_an_unmatched_read_back_stays_unknown_and_is_not_resent(
    db: Database, backend: Backend
) -> None:
    backend.mode["/settings/pressure"] = "drop_before_apply"
    host = _host(db, backend.url)
    session_id = chat_session(db)
    first = host.run_turn(ToolContext("alice", session_id, "r1"), [_put("a", 7)])[0]
    assert first.status == "unknown"
    backend.mode["/settings/pressure"] = "ok"
    second = host.run_turn(ToolContext("alice", session_id, "r2"), [_put("b", 7)])[0]
    assert second.status == "unknown"
    assert second.code == "verify_first"
    assert _receipt_status(db, first) == "unknown"
    assert backend.count("PUT", "/settings/pressure") == 1


def test_next_generation_verifies_its_predecessors_unknown_write(
    db: Database, backend: Backend
) -> None:
    backend.mode["/settings/pressure"] = "drop"
    host = _host(db, backend.url)
    task_id, session_id, fence = running_task(db)
    owner = f"task:{task_id}"
    gen1 = ToolContext(owner, session_id, "g1-r1", task_id=task_id, generation=1, fence=fence)
    assert host.run_turn(gen1, [_put("a", 9)])[0].status == "unknown"
    new_session, new_fence = supersede(db, fence)
    backend.mode["/settings/pressure"] = "ok"
    gen2 = ToolContext(owner, new_session, "g2-r1", task_id=task_id, generation=2, fence=new_fence)
    result = host.run_turn(gen2, [_put("b", 9)])[0]
    assert result.status == "succeeded"
    assert result.code == "verified"
    assert backend.count("PUT", "/settings/pressure") == 1


def test_202_is_pending_and_not_submitted_twice(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    first = host.run_turn(ctx, [_call("a", "startJob", kind="flush")])[0]
    second = host.run_turn(ctx, [_call("b", "startJob", kind="flush")])[0]
    assert first.status == second.status == "pending"
    assert _receipt_status(db, first) == "pending"
    assert backend.count("POST", "/jobs") == 1


def test_read_only_agents_cannot_write_or_read_sensitive(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext("alice", chat_session(db), "r1", readonly=True)
    write, secret, read = host.run_turn(
        ctx, [_put("a"), _call("b", "getSecret", key="db"), _call("c", "getSetting", key="x")]
    )
    assert write.code == secret.code == "readonly"
    assert read.status == "failed"  # 404 on a read: failed, not unknown
    assert read.payload["http_status"] == 404
    assert backend.count("PUT", "/settings/pressure") == 0
    assert backend.count("GET", "/secrets/db") == 0


_MARKED = copy.deepcopy(SPEC)
# A plain GET marked `x-sensitive` (no `x-effect`): a sensitive setting's original value.
_MARKED["paths"]["/secrets/{key}"]["get"] = {"operationId": "getSecret", "x-sensitive": True}


def test_a_read_marked_x_sensitive_is_refused_to_read_only_agents(
    db: Database, backend: Backend
) -> None:
    """Seed 000: a sub-agent may not read a sensitive setting's original value, whether the
    operation says so by `x-effect: sensitive_read` or by `x-sensitive: true`."""
    host = _host(db, backend.url, document=_MARKED)
    ctx = ToolContext("alice", chat_session(db), "r1", readonly=True)
    [secret] = host.run_turn(ctx, [_call("b", "getSecret", key="db")])
    assert secret.code == "readonly"
    assert backend.count("GET", "/secrets/db") == 0
    # The main agent still reads it.
    main = ToolContext("alice", chat_session(db), "r2")
    assert host.run_turn(main, [_call("c", "getSecret", key="db")])[0].status == "succeeded"
    assert backend.count("GET", "/secrets/db") == 1


def test_a_read_only_agent_cannot_page_what_the_main_agent_read(
    db: Database, backend: Backend
) -> None:
    """Seed 000: 管理员结果在降权后不能续读. A sub-agent (read-only, in the same session graph)
    cannot page a result kept for the main agent: handed its result_id, it would read a
    sensitive value the host refuses it, and its answer would carry it into the transcript."""
    host = _host(db, backend.url, document=_MARKED)
    session_id = chat_session(db)
    main = ToolContext("alice", session_id, "r1")
    [report] = host.run_turn(main, [_call("a", "bigReport")])
    result_id = report.payload["result_id"]
    page = ToolCall("p", "read_tool_result", {"result_id": result_id, "offset": 0})
    sub = ToolContext("alice", session_id, "r1/sub1", readonly=True)
    [refused] = host.run_turn(sub, [page])
    assert (refused.status, refused.code) == ("failed", "result_invalid")
    assert host.run_turn(main, [page])[0].status == "succeeded"  # the main agent still pages it
    # What a sub-agent read itself, it pages.
    [own] = host.run_turn(sub, [_call("b", "bigReport")])
    mine = ToolCall("q", "read_tool_result", {"result_id": own.payload["result_id"]})
    assert host.run_turn(sub, [mine])[0].status == "succeeded"


def test_large_reads_are_paged_but_sensitive_ones_are_not(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url)
    ctx = ToolContext("alice", chat_session(db), "r1")
    big, secret = host.run_turn(ctx, [_call("a", "bigReport"), _call("b", "getSecret", key="db")])
    assert big.status == "succeeded"
    assert big.payload["truncated"] is True
    assert "result_id" in big.payload
    assert "result_id" not in secret.payload
    assert len(secret.payload["preview"]) == 4000
    full = ""
    offset: int | None = 0
    while offset is not None:
        page = host.run_turn(
            ctx,
            [
                ToolCall(
                    "p",
                    "read_tool_result",
                    {"result_id": big.payload["result_id"], "offset": offset},
                )
            ],
        )[0]
        assert page.status == "succeeded"
        full += page.payload["content"]
        offset = page.payload["next_offset"]
    assert len(full) == big.payload["total_chars"]
    assert full.startswith(big.payload["preview"])
    assert "é" * 100 in full


def test_a_large_read_marked_x_sensitive_is_not_kept_for_paging(
    db: Database, backend: Backend
) -> None:
    """A sensitive value is not kept in the session's result cache, whether its operation says
    `x-effect: sensitive_read` or is a read marked `x-sensitive`; before, the latter was kept
    (15 minutes in memory, a `result_id` any call of the session could page)."""
    host = _host(db, backend.url, document=_MARKED)
    ctx = ToolContext("alice", chat_session(db), "r1")
    [secret] = host.run_turn(ctx, [_call("a", "getSecret", key="db")])
    assert secret.status == "succeeded"
    assert secret.payload["truncated"] is True
    assert "result_id" not in secret.payload
    assert secret.payload["note"] == "sensitive results are not kept for paging; narrow the query"


def test_no_claim_no_request_when_the_store_is_down(tmp_path: Path, backend: Backend) -> None:
    unmigrated = Database.from_url(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        host = _host(unmigrated, backend.url)
        result = host.run_turn(ToolContext("alice", "s1", "r1"), [_put("a")])[0]
    finally:
        unmigrated.dispose()
    assert result.status == "failed"
    assert result.code == "receipt_unavailable"
    assert sum(backend.requests.values()) == 0


def test_a_held_request_is_seen_by_the_backend_before_any_answer(
    db: Database, backend: Backend
) -> None:
    import threading

    backend.mode["/settings/pressure"] = "hold"
    host = _host(db, backend.url)
    ctx = ToolContext("alice", chat_session(db), "r1")
    results: list[ToolResult] = []
    worker = threading.Thread(target=lambda: results.extend(host.run_turn(ctx, [_put("a")])))
    worker.start()
    assert backend.held.wait(timeout=10)
    # In flight: the receipt is claimed and running before the outcome is known.
    receipts = ReceiptLedger(db).list_for_owner("alice")
    assert [r.status for r in receipts] == ["running"]
    backend.release.set()
    worker.join(timeout=10)
    assert results[0].status == "unknown"


def test_a_superseded_generation_sends_nothing_and_stops(db: Database, backend: Backend) -> None:
    from orchestrator.errors import StaleGeneration

    host = _host(db, backend.url)
    task_id, session_id, fence = running_task(db)
    supersede(db, fence)
    ctx = ToolContext(f"task:{task_id}", session_id, "g1", task_id=task_id, fence=fence)
    with pytest.raises(StaleGeneration):
        host.run_turn(ctx, [_put("a")])
    assert sum(backend.requests.values()) == 0
    assert ReceiptLedger(db).list_for_owner(f"task:{task_id}") == []


def test_superseded_while_in_flight_leaves_the_receipt_running(
    db: Database, backend: Backend
) -> None:
    import threading

    from orchestrator.errors import StaleGeneration

    backend.mode["/settings/pressure"] = "hold"
    host = _host(db, backend.url)
    task_id, session_id, fence = running_task(db)
    ctx = ToolContext(f"task:{task_id}", session_id, "g1", task_id=task_id, fence=fence)
    raised: list[BaseException] = []

    def turn() -> None:
        try:
            host.run_turn(ctx, [_put("a")])
        except StaleGeneration as exc:
            raised.append(exc)

    worker = threading.Thread(target=turn)
    worker.start()
    assert backend.held.wait(timeout=10)
    supersede(db, fence)
    backend.release.set()
    worker.join(timeout=10)
    assert len(raised) == 1
    receipts = ReceiptLedger(db).list_for_owner(f"task:{task_id}")
    assert [r.status for r in receipts] == ["running"]  # a cold start makes it unknown


def test_gateway_tools_from_a_yaml_spec_and_settings(tmp_path: Path, backend: Backend) -> None:
    import yaml

    from orchestrator.settings import load_settings
    from orchestrator.tools.gateway import gateway_tools

    assert gateway_tools(load_settings(home=tmp_path)) == []
    spec_file = tmp_path / "backend.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    settings = load_settings(
        home=tmp_path,
        gateway_spec=spec_file,
        gateway_base_url=backend.url,
        gateway_timeout_seconds=2,
    )
    tools = gateway_tools(settings)
    assert [tool.name for tool in tools] == ["call_api", "describe_api_operation"]
    host = ToolHost(tools, ledger=None)
    read, described = host.run_turn(
        ToolContext("alice", "s1", "r1"),
        [
            _call("a", "getSetting", key="missing"),
            ToolCall("b", "describe_api_operation", {"operation_id": "createOrder"}),
        ],
    )
    assert read.payload["http_status"] == 404
    assert described.payload["effect"] == "write"
    assert "quantity" in str(described.payload["arguments"])
    assert "putSetting (write)" in host.schemas()[0]["description"]


def _with(**changes: Any) -> dict[str, Any]:
    document = copy.deepcopy(SPEC)
    for where, value in changes.items():
        node = document
        *parents, last = where.split("|")
        for part in parents:
            node = node[part]
        node[last] = value
    return document


_NULLABLE = _with(
    **{
        "components|schemas|Setting|properties|value": {"type": "integer", "nullable": True},
        "components|schemas|Setting|properties|unit": {"type": "string", "nullable": True},
    }
)
_NUMBERED = _with(
    **{
        "components|schemas|Setting|properties|value": {"type": "number"},
        "components|schemas|Setting|properties|extra": {"type": "object"},
    }
)
_NOTED = _with(
    **{
        "paths|/orders|post|parameters": [
            {"name": "X-Note", "in": "header", "schema": {"type": "string"}}
        ]
    }
)


def test_an_explicit_null_is_sent_and_is_its_own_intent(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url, document=_NULLABLE)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    cleared = host.run_turn(ctx, [_put("a", None)])[0]
    assert cleared.status == "succeeded"
    # A full replacement with {"value": null} reaches the backend as that, not as {}.
    assert backend.settings["pressure"] == {"value": None}
    plain, with_null = host.run_turn(
        ctx,
        [
            _call("b", "putSetting", key="pressure", body={"value": 5}),
            _call("c", "putSetting", key="pressure", body={"value": 5, "unit": None}),
        ],
    )
    # Two different writes: two receipts, two requests (they were one intent before).
    assert plain.status == with_null.status == "succeeded"
    assert plain.invocation_id != with_null.invocation_id
    assert backend.count("PUT", "/settings/pressure") == 3
    assert backend.settings["pressure"] in ({"value": 5}, {"value": 5, "unit": None})


def test_the_fingerprint_is_taken_on_what_is_sent(db: Database, backend: Backend) -> None:
    from orchestrator.domain.fingerprints import fingerprint

    backend.mode["/settings/pressure"] = "drop"  # applied, then the answer is lost
    host = _host(db, backend.url, document=_NULLABLE)
    session_id = chat_session(db)
    first = host.run_turn(
        ToolContext("alice", session_id, "r1"),
        [_call("a", "putSetting", key="pressure", body={"unit": None, "value": "7"})],
    )[0]
    assert first.status == "unknown"
    sent = backend.settings["pressure"]
    assert sent == {"value": 7, "unit": None}
    receipt = ReceiptLedger(db).get(first.invocation_id or "")
    assert receipt is not None
    expected = {
        "operation_id": "putSetting",
        "arguments": {"key": "pressure", "body": sent},
    }
    assert receipt.args_digest == fingerprint(expected)
    # The read-back compares against the same normalized value (null included): verified.
    backend.mode["/settings/pressure"] = "ok"
    second = host.run_turn(
        ToolContext("alice", session_id, "r2"),
        [_call("b", "putSetting", key="pressure", body={"value": 7, "unit": None})],
    )[0]
    assert second.code == "verified"
    assert backend.count("PUT", "/settings/pressure") == 1


def test_a_read_back_that_writes_7_0_as_7_verifies(db: Database, backend: Backend) -> None:
    # A `number` is sent as 7.0; a JavaScript or Go backend answers the read-back with 7, the
    # same JSON number. It used to "differ", so the write stayed unknown for good.
    backend.js_numbers = True
    backend.mode["/settings/pressure"] = "drop"  # applied, then the answer is lost
    host = _host(db, backend.url, document=_NUMBERED)
    session_id = chat_session(db)
    first = host.run_turn(ToolContext("alice", session_id, "r1"), [_put("a", 7)])[0]
    assert first.status == "unknown"
    backend.mode["/settings/pressure"] = "ok"
    second = host.run_turn(ToolContext("alice", session_id, "r2"), [_put("b", 7)])[0]
    assert second.code == "verified"
    assert second.status == "succeeded"
    assert _receipt_status(db, first) == "succeeded"
    assert backend.count("PUT", "/settings/pressure") == 1


def test_a_null_the_schema_forbids_is_refused_before_sending(
    db: Database, backend: Backend
) -> None:
    host = _host(db, backend.url)  # unit is a plain string there
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    result = host.run_turn(
        ctx, [_call("a", "putSetting", key="pressure", body={"value": 5, "unit": None})]
    )[0]
    assert result.status == "failed"
    assert result.code == "invalid_arguments"
    assert sum(backend.requests.values()) == 0


def test_an_unsendable_header_is_invalid_and_blocks_nothing(db: Database, backend: Backend) -> None:
    host = _host(db, backend.url, document=_NOTED)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    order = {"item": "pump", "quantity": 1}
    results = host.run_turn(
        ctx,
        [
            _call("a", "createOrder", body=order, **{"X-Note": "urgent ✓"}),
            _call("b", "createOrder", body=order, **{"X-Note": "x\r\nX-Injected: 1"}),
        ],
    )
    assert [r.status for r in results] == ["failed", "failed"]
    assert all(r.code == "invalid_arguments" for r in results)
    assert sum(backend.requests.values()) == 0
    assert ReceiptLedger(db).list_for_owner("alice") == []
    # Nothing unknown was left behind: the same write, fixed, goes out at once (no
    # "verify first"), and Latin-1 text is carried as such.
    later = ToolContext(owner="alice", session_id=ctx.session_id, round_id="r2")
    fixed = host.run_turn(later, [_call("c", "createOrder", body=order, **{"X-Note": "café"})])
    assert fixed[0].status == "succeeded"
    assert backend.count("POST", "/orders") == 1


def _raise(exc: BaseException) -> Any:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return raiser


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("httpx.Client.build_request", UnicodeEncodeError("ascii", "é", 0, 1, "no")),
        ("httpcore._sync.connection.HTTPConnection._connect", RuntimeError("no socket")),
        (
            "httpcore._sync.http11.HTTP11Connection._send_request_headers",
            __import__("httpcore").LocalProtocolError("Illegal header value"),
        ),
    ],
)
def test_an_error_before_the_request_left_is_failed_not_unknown(
    db: Database,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    error: BaseException,
) -> None:
    host = _host(db, backend.url)
    session_id = chat_session(db)
    with monkeypatch.context() as patch:
        patch.setattr(target, _raise(error))
        result = host.run_turn(ToolContext("alice", session_id, "r1"), [_put("a")])[0]
    assert result.status == "failed"
    assert result.code == "not_sent"
    assert _receipt_status(db, result) == "failed"
    assert sum(backend.requests.values()) == 0
    # Not unknown, so an identical write in the next round is sent, not held for verification.
    again = host.run_turn(ToolContext("alice", session_id, "r2"), [_put("b")])[0]
    assert again.status == "succeeded"
    assert backend.count("PUT", "/settings/pressure") == 1


def test_an_error_once_the_request_is_on_the_wire_stays_unknown(
    db: Database, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host(db, backend.url)
    monkeypatch.setattr(
        "httpcore._sync.http11.HTTP11Connection._send_request_body",
        _raise(RuntimeError("broke while writing the body")),
    )
    result = host.run_turn(ToolContext("alice", chat_session(db), "r1"), [_put("a")])[0]
    assert result.status == "unknown"
    assert _receipt_status(db, result) == "unknown"


def test_an_unreadable_answer_to_a_write_is_unknown_and_not_sent_again(
    db: Database, backend: Backend
) -> None:
    """Seed 000: 响应正文不可用 after the write was sent stays unknown; the identical call then
    verifies first (no verifier here) and is never sent a second time."""
    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    backend.mode["/orders"] = "garbled"
    order = {"item": "valve", "quantity": 2}
    first = host.run_turn(ctx, [_call("a", "createOrder", body=order)])[0]
    assert first.status == "unknown"
    assert _receipt_status(db, first) == "unknown"
    again = host.run_turn(ctx, [_call("b", "createOrder", body=order)])[0]
    assert (again.status, again.code) == ("unknown", "verify_first")
    assert backend.count("POST", "/orders") == 1


def test_a_pending_job_is_submitted_again_by_a_new_request_only(
    db: Database, backend: Backend
) -> None:
    """Seed 000: pending is the history of a confirmed submission, not a queue: the same
    identity never submits twice, a new explicit request (a new intent round) may."""
    host = _host(db, backend.url)
    session = chat_session(db)
    first = host.run_turn(ToolContext("alice", session, "r1"), [_call("a", "startJob", kind="x")])
    same = host.run_turn(ToolContext("alice", session, "r1"), [_call("b", "startJob", kind="x")])
    assert backend.count("POST", "/jobs") == 1
    assert same[0].invocation_id == first[0].invocation_id
    later = host.run_turn(ToolContext("alice", session, "r2"), [_call("c", "startJob", kind="x")])
    assert later[0].status == "pending"
    assert later[0].invocation_id != first[0].invocation_id
    assert backend.count("POST", "/jobs") == 2


def test_a_store_away_when_the_outcome_is_recorded_is_unknown_and_one_warning_line(
    db: Database,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The write went out and was answered, then the store went away before its outcome was
    # recorded: the model is told it is unknown (the receipt stays running), and the log says
    # so in one line with the driver's message (it was a traceback per write in an outage).
    from sqlalchemy.exc import OperationalError

    def store_away(*_args: object, **_kwargs: object) -> bool:
        raise OperationalError(
            "UPDATE invocation_receipts ...", {}, Exception("the database system is shutting down")
        )

    host = _host(db, backend.url)
    ctx = ToolContext(owner="alice", session_id=chat_session(db), round_id="r1")
    monkeypatch.setattr(ReceiptLedger, "finish", store_away)
    with caplog.at_level("WARNING", logger="orchestrator.agent.receipted"):
        result = host.run_turn(ctx, [_put("a")])[0]
    monkeypatch.undo()
    assert result.status == "unknown"
    assert _receipt_status(db, result) == "running"
    assert backend.count("PUT", "/settings/pressure") == 1
    [line] = [r for r in caplog.records if "recording the outcome" in r.getMessage()]
    assert (line.levelname, line.exc_info) == ("WARNING", None)
    assert line.getMessage().endswith("(OperationalError: the database system is shutting down)")
