"""What a round that stops leaves: a lease in doubt, a cancel, a superseded generation, a call
past its time limit; and the recovery snapshot the next generation reads, in-process over a
real store."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import LeaseLost, StopSignal, run_round
from orchestrator.agent.model import Model, ModelTurn
from orchestrator.agent.request import AgentContext
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.cli.task_show import render_explain
from orchestrator.cli.task_transcript import render_transcript
from orchestrator.domain.recovery import Snapshot
from orchestrator.services.recovery import save_round_snapshot
from orchestrator.store import snapshots as snapshot_store
from orchestrator.store import tasks as task_store
from orchestrator.tools.base import (
    Tool,
    ToolArguments,
    ToolCall,
    ToolContext,
    ToolResult,
)
from tests.executions_support import (
    report_call,
    runtime_for,
    wait_for,
)
from tests.openai_server import OpenAIServer, call
from tests.tool_threads import join_tool_threads
from tests.transcript_support import DeafWrite, as_call, claimed, openai_runtime, trigger


class _ReadArgs(ToolArguments):
    pass


class ReadRows(Tool):
    name = "read_rows"
    description = "read many rows"
    arguments = _ReadArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"rows": ["reading " * 150]})


class DoubtDuringSummary(Model):
    """Reads until the history is compacted; the lease comes into doubt during the summary
    call (the lease keeper sets the stop event while the model thinks)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.turns = 0

    def next_turn(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], stop: Any
    ) -> ModelTurn:
        self.turns += 1
        return ModelTurn(None, (ToolCall(f"c{self.turns}", "read_rows", {}),))

    def summary_turn(self, messages: Sequence[dict[str, Any]], stop: Any) -> ModelTurn | None:
        self.stop.set()
        return ModelTurn("a summary written after the lease came into doubt", ())


def test_a_round_whose_lease_is_in_doubt_writes_no_more_transcript_entries(
    store_url: str, scripts: Path
) -> None:
    """Once the stop event is set the writer does not try: no summary entry, although the
    fence (not superseded yet) would still have taken it."""
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        stop = threading.Event()
        writer = TranscriptWriter(rt.db, fence, session_id, {}, stop=stop)
        with pytest.raises(LeaseLost):
            run_round(
                DoubtDuringSummary(stop),
                ToolHost([ReadRows()], ledger=None),
                ToolContext(owner="o", session_id=session_id, round_id="r"),
                brief="find the leak",
                max_turns=20,
                stop=stop,
                recorder=writer,
                context=AgentContext(ContextBudget(3000, 200), TokenCounter()),
                transcript=writer,
            )
        writer.flush()
        entries = rt.tasks.transcript(fence.task_id)["items"]
        kinds = [e["kind"] for e in entries]
        assert "model_turn" in kinds  # the turns before the doubt were written
        assert "summary" not in kinds, kinds
        with rt.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, fence.task_id)
        assert task is not None
        assert (task.generation, task.status) == (1, "running")  # the fence still stands
    finally:
        rt.close()


def test_a_stopped_writer_writes_nothing_and_still_remembers_what_came_back(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        stop = threading.Event()
        writer = TranscriptWriter(rt.db, fence, session_id, {}, stop=stop)
        calls = [ToolCall("a", "t", {}), ToolCall("b", "t", {})]
        writer.model_turn(1, {}, ModelTurn(None, tuple(calls)))
        stop.set()
        # The results that came back after the doubt: in the snapshot, not in the store.
        writer.tool_results(1, calls[:1], [ToolResult.ok(1)])
        writer.flush()
        with pytest.raises(LeaseLost):
            writer.model_turn(2, {}, ModelTurn(None, (ToolCall("c", "t", {}),)))
        child = writer.child("a")
        with pytest.raises(LeaseLost):
            child.model_turn(1, {}, ModelTurn("a sub-agent's answer", ()))
        entries = rt.tasks.transcript(fence.task_id)["items"]
        assert [(e["turn"], e["kind"]) for e in entries] == [(1, "model_turn")]
        snapshot = writer.snapshot("stopped: lease lost", None)
        assert [c["call_id"] for c in snapshot.received] == ["a"]
        assert [c["call_id"] for c in snapshot.unknown] == ["b"]  # "c" never ran
    finally:
        rt.close()


def test_a_stopped_writer_says_why_the_round_stopped(store_url: str, scripts: Path) -> None:
    """A cancel that came while a compaction's summary call was out, or a result was being
    written, left the snapshot's reason "generation 1 of task ... stopped", which the next
    generation and `tasks show` read without the cancel."""
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        stop = StopSignal()
        writer = TranscriptWriter(rt.db, fence, session_id, {}, stop=stop)
        stop.stop("the task was cancelled: operator stop")
        with pytest.raises(LeaseLost) as caught:
            writer.model_turn(1, {}, ModelTurn("late", ()))
        assert str(caught.value).startswith("the task was cancelled: operator stop; ")
        assert "transcript takes nothing more" in str(caught.value)
    finally:
        rt.close()


def test_a_snapshot_from_memory_wins_over_one_from_the_transcript(
    store_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        calls = (ToolCall("a", "count", {}), ToolCall("b", "write_it", {"x": 1}))
        writer.model_turn(1, {}, ModelTurn(None, calls))
        writer.calls["a"] = writer.calls["a"].answered("succeeded", None)
        snapshot = save_round_snapshot(rt.db, writer, "stopped: lease lost")
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.received] == ["a"]
        assert [(c["call_id"], c["status"]) for c in snapshot.unknown] == [("b", "unknown")]
        with rt.db.transaction() as conn:
            stored = snapshot_store.get_snapshot(conn, session_id)
            assert stored is not None
            assert stored.unknown == snapshot.unknown
            assert not snapshot_store.save_snapshot(conn, session_id, snapshot, replace=False)
    finally:
        rt.close()


@pytest.mark.slow
def test_a_cancel_during_a_command_leaves_the_call_unknown_and_the_next_generation_sees_it(
    store_url: str, scripts: Path, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    rt = openai_runtime(store_url, scripts, server, enable_command_tool=True)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.reply(tool_calls=[call("c2", "execute_command", {"command": "sleep 30"})])
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        # The command is running once its model turn is in the transcript.
        wait_for(
            lambda: len(rt.tasks.transcript(task_id)["items"]) >= 3, 10, what="the command turn"
        )
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=20)
        assert not worker.is_alive()
        assert results[0].ran
        assert "stopped" in results[0].detail
        # The fence refusing the stopped command's receipt is the usual end of a cancel: no
        # error with a traceback in the worker's log.
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [(c["call_id"], c["tool"]) for c in snapshot.unknown] == [("c2", "execute_command")]
        assert [c["call_id"] for c in snapshot.received] == ["c1"]
        # Operators see it in the explain view (`tasks show`).
        view = rt.tasks.explain(task_id)
        assert [c["call_id"] for c in view["recovery"]["unknown"]] == ["c2"]
        assert "unknown: c2 execute_command" in render_explain(view)
        requests = len(server.requests)

        # A requeue starts generation 2, whose context opens with the snapshot; nothing replays.
        rt.tasks.requeue(task_id, "continue after the cancel")
        server.reply(tool_calls=[call("d1", "read_task_context", {})])
        server.reply(content="stopping here")
        rt.executions.run(task_id, 2, worker="w1")
        context = json.loads(server.bodies[-1]["messages"][-1]["content"])["result"]
        assert next(iter(context)) == "recovery"
        assert [c["call_id"] for c in context["recovery"]["unknown"]] == ["c2"]
        assert context["recovery"]["verify_first"]
        assert len(server.requests) == requests + 2
        commands = [
            c
            for body in server.bodies[requests:]
            for m in body["messages"]
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "execute_command"
        ]
        assert commands == []  # the new generation's history does not replay the old call
    finally:
        rt.close()


def test_a_cancel_during_parallel_calls_keeps_the_results_that_returned(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server, enable_command_tool=True)
    try:
        server.reply(
            tool_calls=[
                call("c1", "execute_command", {"command": "sleep 30"}),
                call("c2", "read_task_context", {}),
            ]
        )
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        wait_for(lambda: rt.tasks.transcript(task_id)["items"], 10, what="the model turn")
        time.sleep(0.5)  # the read has returned; the command still runs
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=20)
        assert not worker.is_alive()
        assert "stopped" in results[0].detail

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["c1"]
        assert [(c["call_id"], c["status"]) for c in snapshot.received] == [("c2", "succeeded")]
    finally:
        rt.close()


def test_a_cancel_ends_the_round_when_a_write_ignores_it_and_its_receipt_is_unknown(
    store_url: str, scripts: Path, server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the round (its worker slot, the cancel) waited for as long as the tool ran."""
    rt = openai_runtime(store_url, scripts, server)
    tool = DeafWrite()
    rt.executions.receipt_tools.append(tool)
    try:
        server.reply(tool_calls=[call("c1", "deaf_write", {"order": "flush main 4"})])
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        assert tool.started.wait(10)
        rt.tasks.cancel(task_id, "operator stop")
        worker.join(timeout=8)  # the 2 s grace, not the tool's 30 s
        assert not worker.is_alive()
        assert "did not stop" in results[0].detail

        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["c1"]
        (receipt,) = rt.executions.ledger.list_for_owner(f"task:{task_id}")
        assert receipt.status == "unknown"  # the cancel's end of the generation
        # The tool ends late: the fence refuses what it would record; the receipt stays.
        tool.release.set()
        join_tool_threads("deaf_write")
        assert rt.executions.ledger.get(receipt.invocation_id).status == "unknown"  # type: ignore[union-attr]
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        tool.release.set()
        rt.close()


def test_a_write_past_its_time_limit_is_unknown_and_the_round_goes_on_not_cancelled(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Before, a write that never returned held the round `running` for ever (the heartbeat
    kept the lease alive); now it is given up at ORCH_TOOL_TIMEOUT_SECONDS, not cancelled."""
    rt = openai_runtime(
        store_url, scripts, server, tool_timeout_seconds=1, gateway_timeout_seconds=0.5
    )
    tool = DeafWrite()
    rt.executions.receipt_tools.append(tool)
    try:
        server.reply(tool_calls=[call("c1", "deaf_write", {"order": "flush main 4"})])
        server.reply(tool_calls=[as_call(report_call("c2", "failed"))])
        server.reply(content="done")
        task_id = trigger(rt)
        started = time.monotonic()
        result = rt.executions.run(task_id, 1, worker="w1")
        assert time.monotonic() - started < 8
        assert "cancel" not in result.detail
        assert "stopped" not in result.detail
        assert result.outcome == "failed", result.detail  # the model's report, read after it

        # What the model saw: unknown, verify before any retry, the setting named.
        shown = json.loads(server.bodies[1]["messages"][-1]["content"])
        assert (shown["status"], shown["code"]) == ("unknown", "tool_timeout")
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in shown["message"]
        assert "read-only" in shown["message"]
        entries = rt.tasks.transcript(task_id)["items"]
        (answer,) = [e for e in entries if e["kind"] == "tool_result" and e["call_id"] == "c1"]
        assert (answer["status"], answer["body"]["code"]) == ("unknown", "tool_timeout")
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in render_transcript(rt.tasks.transcript(task_id))

        # The operator's view: the task is not cancelled; the receipt says why it is unknown.
        view = rt.tasks.explain(task_id)
        assert view["status"] == "failed"
        assert view["executions"][0]["outcome"] == "failed"
        (receipt,) = rt.executions.ledger.list_for_owner(f"task:{task_id}")
        assert receipt.status == "unknown"
        shown_text = render_explain(view)
        assert "host's time limit" in shown_text
        assert "ancel" not in shown_text
        # The tool ends late: nothing it says changes the receipt.
        tool.release.set()
        join_tool_threads("deaf_write")
        late = rt.executions.ledger.get(receipt.invocation_id)
        assert late is not None
        assert (late.status, late.summary) == ("unknown", receipt.summary)
    finally:
        tool.release.set()
        rt.close()


def test_a_cancel_while_the_model_thinks_says_the_task_was_cancelled(
    store_url: str, scripts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the round's stop read "the lease may have run out" after an operator's cancel."""
    with OpenAIServer(delay_s=5) as slow:
        rt = openai_runtime(store_url, scripts, slow)
        try:
            slow.reply(content="done")
            task_id = trigger(rt)
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
            )
            worker.start()
            slow.wait_for_requests(1)
            rt.tasks.cancel(task_id, "operator stop")
            worker.join(timeout=8)
            assert not worker.is_alive()
            assert "the task was cancelled: operator stop" in results[0].detail
            lines = [r.getMessage() for r in caplog.records]
            assert not [line for line in lines if "may have run out" in line]
            assert [line for line in lines if "the task was cancelled: operator stop" in line]
        finally:
            rt.close()


def test_the_snapshot_waits_a_bounded_time_for_the_rounds_last_results(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000: 聊天快照保存采用有界等待. A background transcript write that never returns (a
    store that hangs) does not hold the round's way out: the snapshot is saved from memory."""
    from concurrent.futures import Future

    from orchestrator.services import recovery

    monkeypatch.setattr(recovery, "SNAPSHOT_WAIT_SECONDS", 0.2)
    rt, _ = runtime_for(store_url, scripts)
    hung: Future[None] = Future()
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        calls = (ToolCall("a", "count", {}), ToolCall("b", "write_it", {"x": 1}))
        writer.model_turn(1, {}, ModelTurn(None, calls))
        writer.calls["a"] = writer.calls["a"].answered("succeeded", None)
        writer._pending = hung  # its last results' write never comes back
        saved: list[Snapshot | None] = []
        way_out = threading.Thread(
            target=lambda: saved.append(save_round_snapshot(rt.db, writer, "stopped")),
            daemon=True,
        )
        way_out.start()
        way_out.join(timeout=5)
        assert not way_out.is_alive(), "the snapshot waited without a bound"
        (snapshot,) = saved
        assert snapshot is not None
        assert [c["call_id"] for c in snapshot.unknown] == ["b"]
        with rt.db.transaction(readonly=True) as conn:
            stored = snapshot_store.get_snapshot(conn, session_id)
        assert stored is not None
        assert [c["call_id"] for c in stored.received] == ["a"]
    finally:
        hung.set_result(None)
        rt.close()


def test_the_snapshot_write_gives_up_on_a_held_lock_within_its_bound(
    pg_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Postgres a row lock held elsewhere bounds the snapshot's write too (SQLite's own
    busy timeout bounds it there); the round goes on, and the next generation rebuilds the
    snapshot from the durable transcript."""
    from orchestrator.services import recovery

    monkeypatch.setattr(recovery, "SNAPSHOT_WAIT_SECONDS", 0.3)
    rt, _ = runtime_for(pg_url, scripts)
    try:
        fence, session_id = claimed(rt)
        writer = TranscriptWriter(rt.db, fence, session_id, {})
        writer.model_turn(1, {}, ModelTurn(None, (ToolCall("a", "count", {}),)))
        first = save_round_snapshot(rt.db, writer, "stopped")
        assert first is not None
        with rt.db.transaction() as holder:
            holder.exec_driver_sql(
                "SELECT 1 FROM recovery_snapshots WHERE session_id = %s FOR UPDATE",
                (session_id,),
            )
            started = time.monotonic()
            saved: list[Snapshot | None] = []
            way_out = threading.Thread(
                target=lambda: saved.append(save_round_snapshot(rt.db, writer, "again")),
                daemon=True,
            )
            way_out.start()
            way_out.join(timeout=5)
            assert not way_out.is_alive(), "the snapshot waited for the lock without a bound"
        assert saved == [None]
        assert time.monotonic() - started < 3
    finally:
        rt.close()
