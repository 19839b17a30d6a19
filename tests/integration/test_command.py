"""`execute_command` for real: exit codes, timeouts, process groups, cancellation, receipts."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools import child_processes
from orchestrator.tools.base import ToolCall, ToolCancelled, ToolContext, ToolResult
from orchestrator.tools.command import ExecuteCommand
from tests.integration.receipt_rows import chat_session


@pytest.fixture
def host(sqlite_url: str) -> Any:
    db = Database.from_url(sqlite_url)
    tool = ExecuteCommand(secrets=["store-pw-1234", "sk-worker-key"])
    yield ToolHost([tool], ledger=ReceiptLedger(db))
    tool.reap_all()
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
    monkeypatch.setattr(child_processes, "kill_group", lambda popen: False)
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


# -- after the end: cached results, unknown ids ---------------------------------------------


def _tool(host: ToolHost) -> ExecuteCommand:
    tool = host.tools["execute_command"]
    assert isinstance(tool, ExecuteCommand)
    return tool


def _leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("orch-command-*"))


@pytest.fixture
def tmpdir_for_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Output files go to a folder of this test, so leftovers can be counted."""
    directory = tmp_path / "output"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


@pytest.mark.parametrize(
    ("script", "status", "code"), [("exit 3", "failed", 3), ("true", "succeeded", 0)]
)
def test_read_wait_stop_after_the_end_repeat_the_final_result(
    host: ToolHost, tmpdir_for_output: Path, script: str, status: str, code: int
) -> None:
    ctx = _ctx(host)
    started = _run(host, ctx, "s", action="start", command=f"echo done; {script}")
    process_id = started.payload["process_id"]
    first = _run(host, ctx, "w1", action="wait", process_id=process_id, timeout_seconds=5)
    assert first.status == status
    assert first.payload["exit_code"] == code
    assert first.payload["output"] == "done\n"
    assert first.payload["execution_outcome"] == "exited"
    # A short output needs no file once the process ended.
    assert _leftovers(tmpdir_for_output) == []
    for call_id, action in (("r", "read"), ("w2", "wait"), ("t", "stop")):
        again = _run(host, ctx, call_id, action=action, process_id=process_id)
        assert again.code is None, again
        assert again.status == status
        assert again.payload["exit_code"] == code
        assert again.payload["output"] == "done\n"
        assert again.payload["running"] is False
    read = _run(host, ctx, "r2", action="read", process_id=process_id, offset=2)
    assert read.payload["content"] == "ne\n"
    assert read.payload["next_offset"] is None


def test_read_sees_the_end_without_a_wait(host: ToolHost) -> None:
    ctx = _ctx(host)
    started = _run(host, ctx, "s", action="start", command="echo quick; exit 4")
    process_id = started.payload["process_id"]
    deadline = time.monotonic() + 5
    read = _run(host, ctx, "r0", action="read", process_id=process_id)
    while read.payload["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
        read = _run(host, ctx, f"r{time.monotonic()}", action="read", process_id=process_id)
    assert read.status == "failed"  # the command failed; the read reports it, not hides it
    assert read.payload["exit_code"] == 4
    assert read.payload["content"] == "quick\n"
    waited = _run(host, ctx, "w", action="wait", process_id=process_id)
    assert (waited.status, waited.payload["exit_code"]) == ("failed", 4)


def test_an_unconfirmed_end_keeps_the_output_and_the_handle(
    host: ToolHost, monkeypatch: pytest.MonkeyPatch, tmpdir_for_output: Path
) -> None:
    monkeypatch.setattr(child_processes, "kill_group", lambda popen: False)
    ctx = _ctx(host)
    result = _run(host, ctx, command="echo early; sleep 1", timeout_seconds=0.3)
    monkeypatch.undo()
    assert result.status == "unknown"
    assert result.payload["exit_code"] is None
    assert "not undo" in result.payload["note"]
    process_id = result.payload["process_id"]
    read = _run(host, ctx, "r", action="read", process_id=process_id)
    assert read.code is None, read
    assert read.payload["running"] is True
    assert read.payload["content"] == "early\n"
    waited = _run(host, ctx, "w", action="wait", process_id=process_id, timeout_seconds=5)
    # It outlived its timeout: never reported as a success, whatever its exit code.
    assert waited.status == "failed"
    assert waited.payload["timed_out"] is True
    assert waited.payload["output"] == "early\n"
    again = _run(host, ctx, "w2", action="wait", process_id=process_id)
    assert (again.status, again.payload["output"]) == ("failed", "early\n")
    assert _leftovers(tmpdir_for_output) == []


def test_after_a_stop_the_process_reports_stopped_and_failed(host: ToolHost) -> None:
    ctx = _ctx(host)
    started = _run(host, ctx, "s", action="start", command="echo begun; sleep 30")
    process_id = started.payload["process_id"]
    time.sleep(0.2)
    stopped = _run(host, ctx, "t", action="stop", process_id=process_id)
    assert stopped.status == "succeeded"  # the stop did what it was asked
    assert stopped.payload["stopped"] is True
    assert "not undo" in (stopped.message or "")
    # The command itself did not finish: never a success.
    for call_id, action in (("r", "read"), ("w", "wait"), ("t2", "stop")):
        after = _run(host, ctx, call_id, action=action, process_id=process_id)
        assert after.code is None, after
        assert after.status == "failed"
        assert after.payload["execution_outcome"] == "stopped"
        assert after.payload["output"] == "begun\n"


@pytest.mark.parametrize("action", ["read", "wait", "stop"])
def test_an_unknown_process_id_is_a_clear_failure(host: ToolHost, action: str) -> None:
    result = _run(host, _ctx(host), action=action, process_id="0" * 32)
    assert result.status == "failed"
    assert result.code == "not_found"
    assert "cleaned up" in (result.message or "")


# -- reaping: round end, cancellation --------------------------------------------------------


def test_reap_kills_the_sessions_processes_and_deletes_their_files(
    host: ToolHost, tmp_path: Path, tmpdir_for_output: Path
) -> None:
    tool = _tool(host)
    ctx = _ctx(host)
    other = _ctx(host)
    leader, child = tmp_path / "leader", tmp_path / "child"
    background = _run(
        host,
        ctx,
        "a",
        action="start",
        command=f"echo $$ > {leader}; sleep 30 & echo $! > {child}; wait",
    )
    to_stop = _run(host, ctx, "b", action="start", command="echo x; sleep 30")
    long_run = _run(host, ctx, "c", command="seq 1 20000")
    assert long_run.payload["output_file"] is not None
    kept = _run(host, other, "d", action="start", command="sleep 30")
    deadline = time.monotonic() + 5
    while not child.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = _run(host, ctx, "e", action="stop", process_id=to_stop.payload["process_id"])
    assert stopped.status == "succeeded"
    # The stopped command's short output was kept in its result, its file deleted at once.
    assert len(_leftovers(tmpdir_for_output)) == 3
    pids = [int(leader.read_text()), int(child.read_text())]

    assert tool.reap(ctx.session_id) == 3
    # The leader's end is confirmed by reap; the grandchild's SIGKILL lands asynchronously (the
    # kernel may not have run it yet on a loaded machine), so it gets a moment.
    deadline = time.monotonic() + 3
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(_alive(pid) for pid in pids)
    assert _leftovers(tmpdir_for_output) == [Path(kept.payload["output_file"]).name]
    for call_id, process_id in (
        ("f", background.payload["process_id"]),
        ("g", to_stop.payload["process_id"]),
        ("h", long_run.payload["process_id"]),
    ):
        gone = _run(host, ctx, call_id, action="read", process_id=process_id)
        assert (gone.status, gone.code) == ("failed", "not_found")
    # Idempotent; another session is untouched until it is reaped.
    assert tool.reap(ctx.session_id) == 0
    read = _run(host, other, "i", action="read", process_id=kept.payload["process_id"])
    assert read.payload["running"] is True
    assert tool.reap(other.session_id) == 1
    assert _leftovers(tmpdir_for_output) == []


def test_a_cancelled_run_kills_the_group_and_deletes_its_file(
    host: ToolHost, tmp_path: Path, tmpdir_for_output: Path
) -> None:
    cancel = threading.Event()
    ctx = _ctx(host, cancel=cancel)
    leader, child = tmp_path / "leader", tmp_path / "child"
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(ToolCancelled):
        _run(
            host,
            ctx,
            command=f"echo $$ > {leader}; sleep 30 & echo $! > {child}; wait",
            timeout_seconds=20,
        )
    assert not _alive(int(leader.read_text()))
    deadline = time.monotonic() + 5
    while _alive(int(child.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(child.read_text()))
    assert _leftovers(tmpdir_for_output) == []
    assert _tool(host).reap(ctx.session_id) == 0


def test_a_cancelled_run_that_will_not_die_is_left_to_reap(
    host: ToolHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tmpdir_for_output: Path
) -> None:
    monkeypatch.setattr(child_processes, "kill_group", lambda popen: False)
    cancel = threading.Event()
    ctx = _ctx(host, cancel=cancel)
    leader = tmp_path / "leader"
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(ToolCancelled):
        _run(host, ctx, command=f"echo $$ > {leader}; sleep 30", timeout_seconds=20)
    monkeypatch.undo()
    pid = int(leader.read_text())
    assert _alive(pid)
    assert len(_leftovers(tmpdir_for_output)) == 1
    assert _tool(host).reap(ctx.session_id) == 1
    assert not _alive(pid)
    assert _leftovers(tmpdir_for_output) == []


def test_start_takes_env_and_keeps_its_working_directory(host: ToolHost, tmp_path: Path) -> None:
    """Seed 000: run 与 start 都支持 env,并保留指定工作目录."""
    ctx = _ctx(host)
    started = _run(
        host,
        ctx,
        "s",
        action="start",
        command="echo $GREETING; pwd",
        env={"GREETING": "hello"},
        cwd=str(tmp_path),
    )
    assert started.status == "pending"
    done = _run(
        host, ctx, "w", action="wait", process_id=started.payload["process_id"], timeout_seconds=5
    )
    assert done.status == "succeeded"
    assert done.payload["output"] == f"hello\n{tmp_path}\n"
    missing = _run(host, ctx, "m", action="start", command="true", cwd=str(tmp_path / "none"))
    assert (missing.status, missing.code) == ("failed", "invalid_arguments")


def test_a_finished_background_command_is_kept_for_the_round_end_past_the_cap(
    host: ToolHost,
) -> None:
    """A background command's receipt is `pending` until the round end settles it from
    `background()`. However many commands finish after it in the same session, it is not
    evicted before then: an evicted one was never reported, and its receipt stayed `pending`
    although the host had seen it end."""
    from orchestrator.tools.command import MAX_FINISHED

    ctx = _ctx(host)
    started = _run(host, ctx, "s", action="start", command="exit 0")
    assert started.status == "pending"
    process_id = started.payload["process_id"]
    waited = _run(host, ctx, "w", action="wait", process_id=process_id, timeout_seconds=5)
    assert waited.status == "succeeded"
    for number in range(MAX_FINISHED + 2):
        assert _run(host, ctx, f"f{number}", command="true").status == "succeeded"
    ended, running = _tool(host).background(ctx.session_id)
    assert running == []
    assert [status for _, status in ended] == ["succeeded"]


def test_a_command_does_not_inherit_the_orchestrators_secrets(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's environment was the worker's whole: `env` (or a task's context that talks
    the model into `curl ...?k=$LLM_API_KEY`) read the model's key, the API token and the
    store's password."""
    monkeypatch.setenv("LLM_API_KEY", "sk-worker-key")
    monkeypatch.setenv("ORCH_API_TOKEN", "tok-worker-api")
    monkeypatch.setenv("PGPASSWORD", "store-pw-1234")  # not a setting: its value is a secret
    monkeypatch.setenv("SITE_NAME", "north works")
    db = Database.from_url(sqlite_url)
    tool = ExecuteCommand(secrets=["store-pw-1234", "sk-worker-key"])
    host = ToolHost([tool], ledger=ReceiptLedger(db))
    try:
        ran = _run(host, _ctx(host), command="env", env={"GREETING": "hi"})
    finally:
        tool.reap_all()
        db.dispose()
    assert ran.status == "succeeded"
    seen = dict(line.split("=", 1) for line in ran.payload["output"].splitlines() if "=" in line)
    for name in ("LLM_API_KEY", "ORCH_API_TOKEN", "PGPASSWORD"):
        assert name not in seen
    assert not [name for name in seen if name.startswith(("ORCH_", "LLM_"))]
    # The rest of the worker's environment, and what the call sets itself, are there.
    assert seen["SITE_NAME"] == "north works"
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["GREETING"] == "hi"
