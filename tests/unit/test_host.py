"""The tool host with fake tools, no store: validation, read-only boundary, errors, paging."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
from pydantic import Field

from orchestrator import logs
from orchestrator.agent.evidence import Citation
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import RECEIVED, LeaseLost, StopSignal
from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.fences import Fence
from orchestrator.errors import NotFound, StaleGeneration, ValidationFailed
from orchestrator.tools.base import (
    Effect,
    Tool,
    ToolArguments,
    ToolCall,
    ToolCancelled,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.results import ReadToolResult, ResultCache
from tests.tool_threads import join_tool_threads

CTX = ToolContext(owner="alice", session_id="s1", round_id="r1")


class EchoArgs(ToolArguments):
    text: str = Field(max_length=100_000)
    times: int = 1


class Echo(Tool):
    name = "echo"
    description = "echo"
    arguments = EchoArgs

    def __init__(self) -> None:
        self.calls = 0

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.calls += 1
        return ToolResult.ok(args.text * args.times)


class Scripted(Tool):
    """Does what its argument says: raise, return garbage, or wait at a barrier."""

    name = "scripted"
    description = "scripted"
    arguments = EchoArgs
    effect_map: ClassVar[dict[str, Effect]] = {
        "write": "write",
        "sensitive": "sensitive_read",
        "internal": "internal_write",  # type: ignore[dict-item]
    }

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=5)
        self.ran: list[str] = []

    def effect_for(self, args: Any) -> Effect:
        return self.effect_map.get(args.text, "read")

    def normalize(self, args: Any) -> Any:
        if args.text == "refuse":
            raise ValidationFailed("refused by the tool's own rule")
        return args

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.ran.append(args.text)
        if args.text == "boom":
            raise RuntimeError("secret detail")
        if args.text == "missing":
            raise NotFound("no such thing")
        if args.text == "stale":
            raise StaleGeneration("superseded")
        if args.text == "cancel":
            raise ToolCancelled("cancelled")
        if args.text == "lease":
            raise LeaseLost("the lease ran out")
        if args.text == "garbage":
            return "not a result"  # type: ignore[return-value]
        if args.text == "barrier":
            self.barrier.wait()
        return ToolResult.ok(args.text)


def _calls(*texts: str) -> list[ToolCall]:
    return [ToolCall(f"c{i}", "scripted", {"text": text}) for i, text in enumerate(texts)]


def test_unknown_tools_and_invalid_arguments_run_nothing() -> None:
    echo = Echo()
    host = ToolHost([echo], ledger=None)
    results = host.run_turn(
        CTX,
        [
            ToolCall("a", "nope", {}),
            ToolCall("b", "echo", {"text": "x", "extra": 1}),
            ToolCall("c", "echo", {"times": 2}),
            ToolCall("d", "echo", {"text": "x", "times": "2"}),
        ],
    )
    assert [r.code for r in results[:3]] == [
        "unknown_tool",
        "invalid_arguments",
        "invalid_arguments",
    ]
    assert results[3].status == "succeeded"
    assert results[3].payload == "xx"  # "2" was coerced by the model's schema
    assert echo.calls == 1


def test_the_tools_own_validation_refuses_before_running() -> None:
    tool = Scripted()
    result = ToolHost([tool], ledger=None).run_turn(CTX, _calls("refuse"))[0]
    assert result.code == "invalid_arguments"
    assert tool.ran == []


def test_read_only_callers_reach_reads_only() -> None:
    tool = Scripted()
    host = ToolHost([tool], ledger=None)
    readonly = ToolContext("alice", "s1", "r1", readonly=True)
    results = host.run_turn(readonly, _calls("write", "sensitive", "internal", "plain"))
    assert [r.code for r in results[:3]] == ["readonly"] * 3
    assert results[3].status == "succeeded"
    assert tool.ran == ["plain"]


def test_writes_without_a_ledger_are_refused() -> None:
    tool = Scripted()
    result = ToolHost([tool], ledger=None).run_turn(CTX, _calls("write"))[0]
    assert result.status == "failed"
    assert result.code == "receipt_unavailable"
    assert tool.ran == []


def test_tool_errors_become_failed_results_without_details() -> None:
    host = ToolHost([Scripted()], ledger=None)
    boom, missing, garbage = host.run_turn(CTX, _calls("boom", "missing", "garbage"))
    assert boom.status == "failed"
    assert boom.code == "tool_error"
    assert "secret detail" not in (boom.message or "")
    assert (missing.status, missing.code) == ("failed", "not_found")
    assert garbage.code == "tool_error"


def test_calls_of_one_turn_run_concurrently_in_order() -> None:
    host = ToolHost([Scripted()], ledger=None)
    # Both calls wait for each other at a barrier: serial execution would time out.
    results = host.run_turn(CTX, _calls("barrier", "x", "barrier"))
    assert [r.payload for r in results] == ["barrier", "x", "barrier"]


def test_stale_generation_propagates_after_the_others_finished() -> None:
    tool = Scripted()
    host = ToolHost([tool], ledger=None)
    with pytest.raises(StaleGeneration):
        host.run_turn(CTX, _calls("cancel", "stale", "x"))
    assert sorted(tool.ran) == ["cancel", "stale", "x"]


def test_cancellation_propagates() -> None:
    host = ToolHost([Scripted()], ledger=None)
    with pytest.raises(ToolCancelled):
        host.run_turn(CTX, _calls("cancel"))
    event = threading.Event()
    event.set()
    tool = Scripted()
    with pytest.raises(ToolCancelled):
        ToolHost([tool], ledger=None).run_turn(
            ToolContext("alice", "s1", "r1", cancel=event), _calls("x")
        )
    assert tool.ran == []


def test_large_results_are_paged_by_character_offset() -> None:
    cache = ResultCache()
    host = ToolHost([Echo(), ReadToolResult(cache)], ledger=None, results=cache)
    text = "ä€𝄞" * 3000  # multi-byte characters: offsets count characters, not bytes
    result = host.run_turn(CTX, [ToolCall("a", "echo", {"text": text})])[0]
    preview = result.payload
    assert preview["truncated"] is True
    assert preview["preview"] == text[:4000]
    assert preview["next_offset"] == 4000
    assert len(preview["result_id"]) == 32
    page = host.run_turn(
        CTX,
        [
            ToolCall(
                "b",
                "read_tool_result",
                {"result_id": preview["result_id"], "offset": 4000, "limit": 10},
            )
        ],
    )[0]
    assert page.payload["content"] == text[4000:4010]
    assert page.payload["next_offset"] == 4010
    # Another session, another owner, a lower clearance: the id reads as invalid.
    for other in (
        ToolContext("alice", "s2", "r1"),
        ToolContext("bob", "s1", "r1"),
    ):
        denied = host.run_turn(
            other, [ToolCall("c", "read_tool_result", {"result_id": preview["result_id"]})]
        )[0]
        assert denied.code == "result_invalid"


def test_without_a_cache_large_results_are_truncated_with_a_note() -> None:
    host = ToolHost([Echo()], ledger=None)
    result = host.run_turn(CTX, [ToolCall("a", "echo", {"text": "x" * 5000})])[0]
    assert result.payload["truncated"] is True
    assert "result_id" not in result.payload
    assert "narrow" in result.payload["note"]


def test_two_tools_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="echo"):
        ToolHost([Echo(), Echo()], ledger=None)


def test_one_call_id_with_other_arguments_is_refused() -> None:
    echo = Echo()
    host = ToolHost([echo], ledger=None)
    first, same, other = host.run_turn(
        CTX,
        [
            ToolCall("a", "echo", {"text": "x"}),
            ToolCall("a", "echo", {"text": "x"}),
            ToolCall("a", "echo", {"text": "y"}),
        ],
    )
    assert first.status == same.status == "succeeded"
    assert other.code == "invocation_conflict"
    assert echo.calls == 2


def test_a_lost_lease_inside_a_tool_propagates_instead_of_becoming_a_tool_error() -> None:
    host = ToolHost([Scripted()], ledger=None)
    with pytest.raises(LeaseLost):
        host.run_turn(CTX, _calls("lease"))


def test_a_call_id_reused_with_other_arguments_in_a_later_turn_is_refused() -> None:
    echo = Echo()
    host = ToolHost([echo], ledger=None)
    first = host.run_turn(CTX, [ToolCall("same", "echo", {"text": "a"})])[0]
    again = host.run_turn(CTX, [ToolCall("same", "echo", {"text": "a"})])[0]
    other = host.run_turn(CTX, [ToolCall("same", "echo", {"text": "b"})])[0]
    assert (first.status, again.status) == ("succeeded", "succeeded")
    assert (other.status, other.code) == ("failed", "invocation_conflict")
    assert echo.calls == 2
    # Another round may use the id again.
    next_round = ToolContext(owner="alice", session_id="s1", round_id="r2")
    assert host.run_turn(next_round, [ToolCall("same", "echo", {"text": "b"})])[0].status == (
        "succeeded"
    )


class Stubborn(Tool):
    """Ignores `ctx.cancel`: blocks until its test lets it go (a hung client, a deaf library)."""

    name = "stubborn"
    description = "stubborn"
    arguments = EchoArgs

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.started.set()
        self.release.wait(30)
        return ToolResult.ok(args.text)


@pytest.mark.parametrize("calls", [["a"], ["a", "b"]], ids=["one call", "two calls"])
def test_a_cancel_ends_the_turn_within_the_grace_even_if_a_tool_ignores_it(
    calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("orchestrator.agent.host.CANCEL_GRACE_SECONDS", 0.3)
    tool = Stubborn()
    cancel = threading.Event()
    ctx = ToolContext("alice", "s1", "r1", cancel=cancel)
    turn = [ToolCall(f"c{i}", "stubborn", {"text": text}) for i, text in enumerate(calls)]
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    try:
        with pytest.raises(ToolCancelled, match="did not stop"):
            ToolHost([tool], ledger=None).run_turn(ctx, turn)
        # Not the tool's 30 s: the round stops, the deaf call is left to end by itself.
        assert time.monotonic() - started < 2.0
        assert tool.started.is_set()
    finally:
        tool.release.set()


def test_a_call_left_behind_says_why_the_round_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lease in doubt sets the same signal as a cancel: the line must not call it a cancel.
    monkeypatch.setattr("orchestrator.agent.host.CANCEL_GRACE_SECONDS", 0.2)
    tool = Stubborn()
    stop = StopSignal()
    ctx = ToolContext("alice", "s1", "r1", cancel=stop)
    threading.Timer(0.1, stop.stop, args=["the lease could not be renewed"]).start()
    try:
        with pytest.raises(ToolCancelled) as raised:
            ToolHost([tool], ledger=None).run_turn(ctx, [ToolCall("c0", "stubborn", {"text": "x"})])
        assert str(raised.value).startswith("the lease could not be renewed; call(s) c0 did not")
        assert "cancelled" not in str(raised.value)
    finally:
        tool.release.set()


def test_a_cancel_keeps_the_results_of_the_calls_that_returned_when_another_ignores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("orchestrator.agent.host.CANCEL_GRACE_SECONDS", 0.2)
    tool = Stubborn()
    cancel = threading.Event()
    ctx = ToolContext("alice", "s1", "r1", cancel=cancel)
    turn = [ToolCall("fast", "echo", {"text": "hi"}), ToolCall("deaf", "stubborn", {"text": "x"})]
    threading.Timer(0.2, cancel.set).start()
    try:
        with pytest.raises(ToolCancelled) as raised:
            ToolHost([Echo(), tool], ledger=None).run_turn(ctx, turn)
        received = getattr(raised.value, RECEIVED)
        assert [(call.id, result.status) for call, result in received] == [("fast", "succeeded")]
    finally:
        tool.release.set()


class LogContext(Tool):
    name = "log_context"
    description = "the log context a tool runs in"
    arguments = EchoArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok(dict(logs._context.get()))


@pytest.mark.parametrize("count", [1, 2])
def test_tools_run_in_the_log_context_of_the_round(count: int) -> None:
    ctx = ToolContext("alice", "s1", "r1", cancel=threading.Event())
    turn = [ToolCall(f"c{i}", "log_context", {"text": str(i)}) for i in range(count)]
    with logs.log_context(task_id="t-1"):
        results = ToolHost([LogContext()], ledger=None).run_turn(ctx, turn)
    assert [r.payload.get("task_id") for r in results] == ["t-1"] * count


class Recorder:
    """An evidence recorder that keeps what it was asked to record."""

    def __init__(self) -> None:
        self.recorded: list[str] = []

    def cite(
        self, ctx: ToolContext, facts: EvidenceFacts, *, cut: bool, result_id: str | None
    ) -> Citation:
        self.recorded.append(f"facts {facts.content}")
        return Citation(f"ev-{len(self.recorded)}", "2026-12-04T00:00:00+00:00", "sha256:00")


class CitableStubborn(Stubborn):
    name = "citable"

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts:
        return EvidenceFacts("data_source", "s", "live", False, None, {}, f"of {result.payload}")


@pytest.mark.parametrize("cancel", [None, threading.Event()], ids=["no cancel", "cancel unset"])
@pytest.mark.parametrize("calls", [["a"], ["a", "fast"]], ids=["one call", "two calls"])
def test_a_read_past_its_time_limit_is_failed_and_the_turn_goes_on(
    calls: list[str], cancel: threading.Event | None
) -> None:
    """Before, a call that never returned held the turn (and the task) for ever."""
    tool = Stubborn()
    ctx = ToolContext("alice", "s1", "r1", cancel=cancel)
    turn = [
        ToolCall(f"c{i}", "echo" if text == "fast" else "stubborn", {"text": text})
        for i, text in enumerate(calls)
    ]
    started = time.monotonic()
    try:
        results = ToolHost([tool, Echo()], ledger=None, call_timeout=0.3).run_turn(ctx, turn)
        assert 0.3 <= time.monotonic() - started < 2.0
        assert results[0].status == "failed"
        assert results[0].code == "tool_timeout"
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in (results[0].message or "")
        assert "0.3 s" in (results[0].message or "")
        assert "cancel" not in (results[0].code or "")
        assert [r.status for r in results[1:]] == ["succeeded"] * (len(calls) - 1)
        assert cancel is None or not cancel.is_set()
    finally:
        tool.release.set()


def test_a_late_read_records_no_evidence() -> None:
    tool = CitableStubborn()
    recorder = Recorder()
    ctx = ToolContext("alice", "s1", "r1", fence=Fence("t", 1, "tok"), cancel=threading.Event())
    host = ToolHost([tool], ledger=None, call_timeout=0.2, evidence=recorder)  # type: ignore[arg-type]
    results = host.run_turn(ctx, [ToolCall("c1", "citable", {"text": "x"})])
    assert results[0].code == "tool_timeout"
    assert results[0].evidence_id is None
    tool.release.set()  # the call returns late
    join_tool_threads("citable")
    assert recorder.recorded == []
    # In time, the same call is cited: the recorder is not what kept the late one out.
    in_time = host.run_turn(ctx, [ToolCall("c2", "citable", {"text": "y"})])
    assert in_time[0].status == "succeeded"
    assert recorder.recorded == ["facts of y"]


def test_a_timed_out_call_frees_its_slot_for_the_calls_waiting_for_one() -> None:
    tool = Stubborn()
    turn = [ToolCall("deaf", "stubborn", {"text": "x"}), ToolCall("next", "echo", {"text": "y"})]
    try:
        results = ToolHost([tool, Echo()], ledger=None, max_workers=1, call_timeout=0.2).run_turn(
            CTX, turn
        )
        assert [r.status for r in results] == ["failed", "succeeded"]
    finally:
        tool.release.set()


def test_a_cancel_is_still_a_cancel_when_calls_have_a_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("orchestrator.agent.host.CANCEL_GRACE_SECONDS", 0.2)
    tool = Stubborn()
    cancel = threading.Event()
    ctx = ToolContext("alice", "s1", "r1", cancel=cancel)
    threading.Timer(0.1, cancel.set).start()
    try:
        with pytest.raises(ToolCancelled, match="cancelled"):
            ToolHost([tool], ledger=None, call_timeout=30).run_turn(
                ctx, [ToolCall("c1", "stubborn", {"text": "x"})]
            )
    finally:
        tool.release.set()


class Unbounded(Stubborn):
    name = "unbounded"

    def time_limit(self, args: Any, default: float) -> float | None:
        return None


def test_a_tool_bounded_by_its_parts_is_not_given_up() -> None:
    tool = Unbounded()
    threading.Timer(0.5, tool.release.set).start()
    results = ToolHost([tool], ledger=None, call_timeout=0.1).run_turn(
        CTX, [ToolCall("c1", "unbounded", {"text": "x"})]
    )
    assert results[0].status == "succeeded"


def test_quick_calls_keep_their_results_with_a_time_limit() -> None:
    results = ToolHost([Scripted()], ledger=None, call_timeout=5).run_turn(
        CTX, _calls("barrier", "x", "barrier", "boom")
    )
    assert [r.payload for r in results[:3]] == ["barrier", "x", "barrier"]
    assert results[3].code == "tool_error"


class StubbornStoreWrite(Stubborn):
    """A write to the orchestrator's own store (a plan, a proposal, a report) stuck on a lock
    held elsewhere: it may still commit after the host stops waiting."""

    name = "stubborn_store_write"
    effect = "internal_write"


def test_a_store_write_past_its_time_limit_is_unknown_not_failed() -> None:
    """Before, a plan, proposal or report write given up at its limit was answered `failed`,
    "Nothing was received", though it may still commit afterwards: the model would write it
    again or report it missing. Like any write whose end the host did not see, it is unknown."""
    tool = StubbornStoreWrite()
    try:
        (result,) = ToolHost([tool], ledger=None, call_timeout=0.2).run_turn(
            CTX, [ToolCall("c1", "stubborn_store_write", {"text": "x"})]
        )
        assert (result.status, result.code) == ("unknown", "tool_timeout")
        assert "Nothing was received" not in (result.message or "")
        assert "may still take effect" in (result.message or "")
    finally:
        tool.release.set()
