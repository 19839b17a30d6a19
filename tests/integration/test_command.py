"""`execute_command` for real: exit codes, timeouts, process groups, cancellation, receipts."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools import command as command_module
from orchestrator.tools.base import ToolCall, ToolCancelled, ToolContext, ToolResult
from orchestrator.tools.command import ExecuteCommand
from tests.integration.receipt_rows import chat_session


@pytest.fixture
def host(sqlite_url: str) -> Any:
    db = Database.from_url(sqlite_url)
    yield ToolHost([ExecuteCommand()], ledger=ReceiptLedger(db))
    db.dispose()


def _ctx(host: ToolHost, **extra: Any) -> ToolContext:
    assert host.ledger is not None
    return ToolContext("alice", chat_session(host.ledger.db), "r1", **extra)


def _run(host: ToolHost, ctx: ToolContext, call_id: str = "c1", **arguments: Any) -> ToolResult:
    return host.run_turn(ctx, [ToolCall(call_id, "execute_command", arguments)])[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_exit_zero_succeeds_and_nonzero_fails(host: ToolHost, tmp_path: Path) -> None:
    ctx = _ctx(host)
    ok = _run(
        host, ctx, "a", command="echo $GREETING; pwd", env={"GREETING": "hi"}, cwd=str(tmp_path)
    )
    assert ok.status == "succeeded"
    assert ok.payload["exit_code"] == 0
    assert ok.payload["output"] == f"hi\n{tmp_path}\n"
    assert ok.payload["output_file"] is None
    bad = _run(host, ctx, "b", command="echo some output; exit 3")
    assert bad.status == "failed"  # output alone proves nothing
    assert bad.payload["exit_code"] == 3
    assert bad.payload["execution_outcome"] == "exited"
    statuses = sorted(r.status for r in ReceiptLedger(host.ledger.db).list_for_owner("alice"))  # type: ignore[union-attr]
    assert statuses == ["failed", "succeeded"]


def test_the_same_command_twice_runs_twice(host: ToolHost, tmp_path: Path) -> None:
    ctx = _ctx(host)
    marker = tmp_path / "count"
    for call_id in ("a", "b"):
        assert _run(host, ctx, call_id, command=f"echo x >> {marker}").status == "succeeded"
    assert marker.read_text() == "x\nx\n"
    # The same call id again is the same intent: not run a third time.
    assert _run(host, ctx, "b", command=f"echo x >> {marker}").status == "succeeded"
    assert marker.read_text() == "x\nx\n"
    # The same call id with other arguments is refused.
    refused = _run(host, ctx, "b", command="true")
    assert refused.code == "invocation_conflict"


def test_a_timeout_kills_the_process_group_and_fails(host: ToolHost, tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    result = _run(
        host, _ctx(host), command=f"sleep 30 & echo $! > {pidfile}; wait", timeout_seconds=0.5
    )
    assert result.status == "failed"
    assert result.payload["timed_out"] is True
    assert result.payload["execution_outcome"] == "timed_out_and_stopped"
    assert "not undo" in result.payload["note"]
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_an_unconfirmed_end_is_unknown(host: ToolHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command_module, "_kill_group", lambda popen: False)
    ctx = _ctx(host)
    result = _run(host, ctx, command="sleep 2", timeout_seconds=0.2)
    assert result.status == "unknown"
    assert result.payload["execution_outcome"] == "unconfirmed"
    monkeypatch.undo()
    stopped = _run(host, ctx, "s", action="stop", process_id=result.payload["process_id"])
    assert stopped.status == "succeeded"


def test_long_output_goes_to_a_file(host: ToolHost) -> None:
    result = _run(host, _ctx(host), command="seq 1 20000")
    assert result.status == "succeeded"
    path = Path(result.payload["output_file"])
    try:
        assert path.read_text().splitlines()[-1] == "20000"
        assert len(result.payload["output"]) < 3100
    finally:
        path.unlink()


def test_cancellation_kills_records_unknown_and_propagates(host: ToolHost, tmp_path: Path) -> None:
    cancel = threading.Event()
    ctx = _ctx(host, cancel=cancel)
    pidfile = tmp_path / "pid"
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(ToolCancelled):
        _run(host, ctx, command=f"echo $$ > {pidfile}; sleep 30", timeout_seconds=20)
    pid = int(pidfile.read_text())
    assert not _alive(pid)
    receipts = ReceiptLedger(host.ledger.db).list_for_owner("alice")  # type: ignore[union-attr]
    assert [r.status for r in receipts] == ["unknown"]


def test_start_read_wait_stop(host: ToolHost) -> None:
    ctx = _ctx(host)
    started = _run(host, ctx, "s", action="start", command="echo started; sleep 30")
    assert started.status == "pending"
    process_id = started.payload["process_id"]
    time.sleep(0.3)
    read = _run(host, ctx, "r", action="read", process_id=process_id)
    assert read.status == "succeeded"
    assert read.payload["content"] == "started\n"
    assert read.payload["running"] is True
    waited = _run(host, ctx, "w", action="wait", process_id=process_id, timeout_seconds=0.2)
    assert waited.status == "pending"
    # A read-only agent may read and wait, not stop.
    readonly = ToolContext("alice", ctx.session_id, "r1", readonly=True)
    assert _run(host, readonly, "x", action="stop", process_id=process_id).code == "readonly"
    assert _run(host, readonly, "y", action="read", process_id=process_id).status == "succeeded"
    # Another session cannot touch it.
    other = _ctx(host)
    assert _run(host, other, "z", action="read", process_id=process_id).code == "not_found"
    stopped = _run(host, ctx, "t", action="stop", process_id=process_id)
    assert stopped.status == "succeeded"
    assert stopped.payload["stopped"] is True
