"""`execute_command`: run a shell command on the worker, honestly reported (seed 000).

Off unless `ORCH_ENABLE_COMMAND_TOOL` is set. `succeeded` only on a normal exit with code 0; a
non-zero exit, or a timeout that stopped the process, is `failed`; an end that cannot be
confirmed is `unknown`. Output goes straight to a temporary file (no reader threads to leak);
the result carries a preview and, for long output, `output_file`. Cancellation kills the
process group and closes the file. Neither a timeout nor a cancellation undoes what the command
already did, and the result says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import IO, Any, Literal

from pydantic import Field, model_validator

from orchestrator.domain.outcomes import Outcome, model_message, tool_status
from orchestrator.settings import Settings
from orchestrator.tools.base import (
    Effect,
    Tool,
    ToolArguments,
    ToolCancelled,
    ToolContext,
    ToolResult,
)

__all__ = ["ExecuteCommand", "ExecuteCommandArgs", "command_tools"]

PREVIEW = 3000  # with the other fields, the JSON stays under the host preview size
READ_LIMIT = 16000
_POLL = 0.05
_TERM_GRACE = 2.0
_KILL_GRACE = 3.0
_NOT_UNDONE = "A timeout or cancellation does not undo what the command already did."


class ExecuteCommandArgs(ToolArguments):
    action: Literal["run", "start", "read", "wait", "stop"] = "run"
    command: str | None = Field(default=None, max_length=8000, description="for run and start")
    cwd: str | None = Field(default=None, description="working directory (kept as given)")
    env: dict[str, str] = Field(default_factory=dict, description="added to the environment")
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    process_id: str | None = Field(default=None, description="for read, wait and stop")
    offset: int = Field(default=0, ge=0, description="read: Unicode character offset")

    @model_validator(mode="after")
    def _needs(self) -> ExecuteCommandArgs:
        if self.action in ("run", "start") and not self.command:
            raise ValueError(f"action {self.action!r} needs a command")
        if self.action in ("read", "wait", "stop") and not self.process_id:
            raise ValueError(f"action {self.action!r} needs a process_id")
        return self


@dataclass
class _Process:
    owner: str
    session_id: str
    popen: subprocess.Popen[bytes]
    path: str
    file: IO[bytes]


class ExecuteCommand(Tool):
    name = "execute_command"
    description = (
        "Run a shell command (run), or start one in the background (start) and then read its "
        "output, wait for it or stop it. Success only on exit code 0; output alone proves nothing."
    )
    effect = "write"
    arguments = ExecuteCommandArgs
    # identity stays "call": running the same diagnostic twice is two intents, not one.

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: dict[str, _Process] = {}

    def effect_for(self, args: Any) -> Effect:
        return "read" if args.action in ("read", "wait") else "write"

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        if args.action == "run":
            return self._run(ctx, args)
        if args.action == "start":
            return self._start(ctx, args)
        process = self._lookup(ctx, args.process_id)
        if process is None:
            return ToolResult.failed("no such process for this session", code="not_found")
        if args.action == "read":
            return self._read(args.process_id, process, args.offset)
        if args.action == "wait":
            return self._wait(ctx, args.process_id, process, args.timeout_seconds)
        return self._stop(args.process_id, process)

    # -- actions -----------------------------------------------------------------------------

    def _run(self, ctx: ToolContext, args: ExecuteCommandArgs) -> ToolResult:
        process = self._spawn(ctx, args)
        if isinstance(process, ToolResult):
            return process
        try:
            ended = _wait_for(process.popen, args.timeout_seconds, ctx)
            timed_out = not ended
            if timed_out:
                ended = _kill_group(process.popen)
        finally:
            process.file.close()  # also on cancellation: no open file outlives the call
        result = self._report(process, ended=ended, timed_out=timed_out, keep_file=True)
        if not ended:
            # Keep a handle so the model can wait for it or stop it later.
            process_id = uuid.uuid4().hex
            with self._lock:
                self._processes[process_id] = process
            result.payload["process_id"] = process_id
        return result

    def _start(self, ctx: ToolContext, args: ExecuteCommandArgs) -> ToolResult:
        process = self._spawn(ctx, args)
        if isinstance(process, ToolResult):
            return process
        process_id = uuid.uuid4().hex
        with self._lock:
            self._processes[process_id] = process
        return ToolResult(
            status="pending",
            payload={"process_id": process_id, "pid": process.popen.pid, "status": "pending"},
            message="Started in the background; it is not finished. Use read, wait or stop.",
            outcome="submitted",
        )

    def _read(self, process_id: str, process: _Process, offset: int) -> ToolResult:
        process.file.flush()
        text = _text(process.path)
        page = text[offset : offset + READ_LIMIT]
        end = offset + len(page)
        return ToolResult.ok(
            {
                "process_id": process_id,
                "running": process.popen.poll() is None,
                "exit_code": process.popen.returncode,
                "content": page,
                "next_offset": end if end < len(text) else None,
            }
        )

    def _wait(
        self, ctx: ToolContext, process_id: str, process: _Process, timeout: float
    ) -> ToolResult:
        if not _wait_for(process.popen, timeout, ctx, kill_on_cancel=False):
            return ToolResult(
                status="pending",
                payload={"process_id": process_id, "running": True, "status": "pending"},
                message="Still running after the wait; it is not finished.",
                outcome="submitted",
            )
        process.file.close()
        return self._report(process, ended=True, timed_out=False, keep_file=True)

    def _stop(self, process_id: str, process: _Process) -> ToolResult:
        ended = _kill_group(process.popen)
        process.file.close()
        if not ended:
            return ToolResult(
                status="unknown",
                payload={"process_id": process_id, "stopped": False, "status": "unknown"},
                message="The process group was signalled but its end cannot be confirmed.",
                outcome="indeterminate",
            )
        with self._lock:
            self._processes.pop(process_id, None)
        return ToolResult(
            status="succeeded",
            payload={
                "process_id": process_id,
                "stopped": True,
                "exit_code": process.popen.returncode,
            },
            message=f"Stopped. {_NOT_UNDONE}",
            outcome="succeeded",
        )

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(self, ctx: ToolContext, args: ExecuteCommandArgs) -> _Process | ToolResult:
        if args.cwd is not None and not os.path.isdir(args.cwd):
            return ToolResult(
                status="failed",
                message=f"working directory {args.cwd!r} does not exist; nothing was run",
                code="invalid_arguments",
                outcome="invalid_arguments",
            )
        fd, path = tempfile.mkstemp(prefix="orch-command-", suffix=".log")
        output = os.fdopen(fd, "wb")
        try:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", str(args.command)],
                cwd=args.cwd,
                env={**os.environ, **args.env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: timeouts kill all of it
            )
        except OSError as exc:
            output.close()
            os.unlink(path)
            return ToolResult(
                status="failed",
                message=f"the command could not be started: {exc.strerror}; nothing was run",
                code="not_started",
                outcome="not_sent",
            )
        return _Process(ctx.owner, ctx.session_id, popen, path, output)

    def _lookup(self, ctx: ToolContext, process_id: str) -> _Process | None:
        with self._lock:
            process = self._processes.get(process_id)
        if process is None or process.owner != ctx.owner or process.session_id != ctx.session_id:
            return None
        return process

    @staticmethod
    def _report(process: _Process, *, ended: bool, timed_out: bool, keep_file: bool) -> ToolResult:
        code = process.popen.returncode if ended else None
        outcome: Outcome
        if not ended:
            outcome, execution = "indeterminate", "unconfirmed"
        elif timed_out:
            outcome, execution = "command_failed", "timed_out_and_stopped"
        elif code == 0:
            outcome, execution = "succeeded", "exited"
        else:
            outcome = "command_failed"
            execution = "exited" if code is not None and code > 0 else "killed_by_signal"
        status = tool_status(outcome)
        text = _text(process.path)
        long_output = len(text) > PREVIEW
        if long_output and keep_file:
            preview = text[: PREVIEW // 2] + "\n[...]\n" + text[-PREVIEW // 2 :]
            output_file: str | None = process.path
        else:
            preview, output_file = text, None
            os.unlink(process.path)
        payload = {
            "exit_code": code,
            "timed_out": timed_out,
            "execution_outcome": execution,
            "status": status,
            "output": preview,
            "output_file": output_file,
        }
        if timed_out or not ended:
            payload["note"] = _NOT_UNDONE
        return ToolResult(
            status=status, payload=payload, message=model_message(outcome), outcome=outcome
        )


def _wait_for(
    popen: subprocess.Popen[bytes], timeout: float, ctx: ToolContext, *, kill_on_cancel: bool = True
) -> bool:
    """True when the process ended within `timeout`; raises `ToolCancelled` on cancellation."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            popen.wait(timeout=min(_POLL, max(0.0, deadline - time.monotonic())))
            return True
        except subprocess.TimeoutExpired:
            pass
        if ctx.cancel is not None and ctx.cancel.is_set():
            if kill_on_cancel:
                _kill_group(popen)
            raise ToolCancelled("cancelled while the command ran")
        if time.monotonic() >= deadline:
            return False


def _kill_group(popen: subprocess.Popen[bytes]) -> bool:
    """TERM then KILL the process group; True only when the end of the process is confirmed."""
    for sig, grace in ((signal.SIGTERM, _TERM_GRACE), (signal.SIGKILL, _KILL_GRACE)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout=grace)
            return True
        except subprocess.TimeoutExpired:
            continue
    return popen.poll() is not None


def _text(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")


def command_tools(settings: Settings) -> list[Tool]:
    """`execute_command` when `ORCH_ENABLE_COMMAND_TOOL` is set, else nothing."""
    return [ExecuteCommand()] if settings.enable_command_tool else []
