"""`execute_command`: run a shell command on the worker, honestly reported (seed 000).

Off unless `ORCH_ENABLE_COMMAND_TOOL` is set. `succeeded` only on a normal exit with code 0; a
non-zero exit, or a timeout that stopped the process, is `failed`; an end that cannot be
confirmed is `unknown`. Output goes straight from the child to a temporary file (no reader
threads to leak, and the parent closes its descriptor at once); the result carries a preview
and, for long output, `output_file`. Once a command's end is confirmed its final result is
computed once, and every later read, wait or stop repeats it.

Every command stays tracked under its `process_id` until `ExecuteCommand.reap(session_id)`
(round end, cancellation, generation change) kills what is left of its process group and
deletes its file. A cancelled `run` kills its group and deletes its file at once (or leaves
both to `reap` when the end cannot be confirmed). The leader is detected as ended without being
reaped, so its pid, which is also the process-group id, cannot be reused by another process
before `reap` signals the group. Neither a timeout nor a cancellation undoes what the command
already did, and the result says so.

The child process itself (its state, waits, the killing of its group) is
`orchestrator.tools.child_processes`; its output file, `orchestrator.tools.command_output`; the
record of one command and how its end is told, `orchestrator.tools.command_process`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.logs import Secret, secrets_of
from orchestrator.settings import Settings
from orchestrator.tools import child_processes
from orchestrator.tools.base import (
    Effect,
    Tool,
    ToolArguments,
    ToolCancelled,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.command_output import (
    delete_output,
    output_page,
)
from orchestrator.tools.command_process import (
    NOT_UNDONE,
    CommandProcess,
    discard,
    final_result,
    repeat_result,
    unconfirmed_result,
)

__all__ = ["ExecuteCommand", "ExecuteCommandArgs", "command_tools"]

#: Finished commands a session keeps handles (and long-output files) for; the oldest go first.
MAX_FINISHED = 32

log = logging.getLogger(__name__)


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


class ExecuteCommand(Tool):
    name = "execute_command"
    description = (
        "Run a shell command (run), or start one in the background (start) and then read its "
        "output, wait for it or stop it. Success only on exit code 0; output alone proves nothing."
    )
    effect = "write"
    secret_arguments = frozenset({"env"})
    arguments = ExecuteCommandArgs
    # identity stays "call": running the same diagnostic twice is two intents, not one.

    def __init__(self, secrets: Iterable[Secret] = ()) -> None:
        #: The configured secrets (`orchestrator.logs.secrets_of`), kept from the child's
        #: environment (`child_processes.child_environment`).
        self._secrets = tuple(secret for secret in secrets if isinstance(secret, str))
        self._lock = threading.Lock()
        self._processes: dict[str, CommandProcess] = {}

    def effect_for(self, args: Any) -> Effect:
        return "read" if args.action in ("read", "wait") else "write"

    def time_limit(self, args: Any, default: float) -> float | None:
        # A run or wait ends by its own timeout, stopping the process (a confirmed `failed`):
        # the host's limit leaves it the time to do so.
        if args.action in ("run", "wait"):
            own = (
                float(args.timeout_seconds)
                + child_processes.TERM_GRACE
                + child_processes.KILL_GRACE
                + 5.0
            )
            return max(default, own)
        return default

    def read_uses(self) -> str | None:
        return "execute_command with action read or wait (an existing command's output)"

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        if args.action == "run":
            return self._run(ctx, args)
        if args.action == "start":
            return self._start(ctx, args)
        process = self._lookup(ctx, args.process_id)
        if process is None:
            return ToolResult.failed(
                f"no process {args.process_id!r} in this session: it was never started here, or "
                "it was cleaned up (round end, cancellation, or too many finished commands); "
                "its output and result are no longer kept",
                code="not_found",
            )
        if args.action == "read":
            return self._read(args.process_id, process, args.offset)
        if args.action == "wait":
            return self._wait(ctx, args.process_id, process, args.timeout_seconds)
        return self._stop(args.process_id, process)

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts | None:
        """The output of a command that exited 0 is citable (only then: output alone proves
        nothing); cut when the output went past the preview or a read stopped early."""
        payload = result.payload
        if (
            args.action not in ("run", "read", "wait")
            or result.status != "succeeded"
            or not isinstance(payload, dict)
            or payload.get("exit_code") != 0
        ):
            return None
        text = payload.get("content", payload.get("output"))
        return EvidenceFacts(
            kind="command",
            source="execute_command",
            origin="live",
            truncated=bool(payload.get("output_file")) or payload.get("next_offset") is not None,
            row_count=None,
            params=args.model_dump(mode="json", exclude={"env"}),
            content=text,
            # The command line, which a read or wait names only by its process (never `env`).
            described=args.command if args.action == "run" else self._command_of(args.process_id),
        )

    def _command_of(self, process_id: str | None) -> str | None:
        with self._lock:
            process = self._processes.get(process_id or "")
        return None if process is None else process.command

    # -- session clean-up --------------------------------------------------------------------

    def reap(self, session_id: str) -> int:
        """Forget every command of `session_id`: kill what is left of each process group (a
        running leader gets TERM then KILL; children left behind by an ended one get KILL) and
        delete the output files. Returns how many commands were forgotten; idempotent (a
        second call returns 0). Call it at round end, on cancellation, on a generation change.

        What a command already did is not undone. Afterwards read, wait and stop on its
        process id answer `failed` with code `not_found`.
        """
        with self._lock:
            ids = [pid for pid, entry in self._processes.items() if entry.session_id == session_id]
            gone = [self._processes.pop(process_id) for process_id in ids]
        for process in gone:
            discard(process)
        return len(gone)

    def background(self, session_id: str) -> tuple[list[tuple[str, str]], list[str]]:
        """The background commands (`start`) of `session_id` with a receipt: those whose end is
        confirmed as (invocation_id, final status), and the invocation ids of those still
        running. The round end settles their `pending` receipts from this (invariant 23)."""
        with self._lock:
            started = [
                entry
                for entry in self._processes.values()
                if entry.session_id == session_id and entry.invocation_id is not None
            ]
        ended: list[tuple[str, str]] = []
        running: list[str] = []
        for process in started:
            assert process.invocation_id is not None
            if child_processes.state(process.popen)[0]:
                ended.append((process.invocation_id, self._ended(process).status))
            else:
                running.append(process.invocation_id)
        return ended, running

    def reap_all(self) -> int:
        """`reap` for every session (worker shutdown, tests)."""
        with self._lock:
            sessions = {entry.session_id for entry in self._processes.values()}
        return sum(self.reap(session_id) for session_id in sessions)

    # -- actions -----------------------------------------------------------------------------

    def _run(self, ctx: ToolContext, args: ExecuteCommandArgs) -> ToolResult:
        spawned = self._spawn(ctx, args)
        if isinstance(spawned, ToolResult):
            return spawned
        process_id, process = spawned
        try:
            ended = child_processes.wait_for(process.popen, args.timeout_seconds, ctx)
        except ToolCancelled:
            # `wait_for` killed the group. Confirmed ended: nothing is kept (file deleted).
            # Otherwise the entry stays for `reap`, which kills again and deletes the file.
            if child_processes.state(process.popen)[0]:
                self._forget(process_id)
            raise
        if not ended:
            process.timed_out = True
            ended = child_processes.kill_group(process.popen)
        if not ended:
            # The handle (and the file) stay so the model can read, wait for or stop it later.
            return unconfirmed_result(process, process_id)
        return repeat_result(self._ended(process), process_id, running=None)

    def _start(self, ctx: ToolContext, args: ExecuteCommandArgs) -> ToolResult:
        spawned = self._spawn(ctx, args)
        if isinstance(spawned, ToolResult):
            return spawned
        process_id, process = spawned
        invocation_id = ctx.extras.get("invocation_id")
        process.invocation_id = invocation_id if isinstance(invocation_id, str) else None
        return ToolResult(
            status="pending",
            payload={
                "process_id": process_id,
                "pid": process.popen.pid,
                "status": "pending",
                "output_file": process.path,
            },
            message="Started in the background; it is not finished. Use read, wait or stop.",
            outcome="submitted",
        )

    def _read(self, process_id: str, process: CommandProcess, offset: int) -> ToolResult:
        if not child_processes.state(process.popen)[0]:
            page, next_offset = output_page(process.text(), offset)
            return ToolResult.ok(
                process.said(
                    {
                        "process_id": process_id,
                        "running": True,
                        "exit_code": None,
                        "content": page,
                        "next_offset": next_offset,
                    }
                )
            )
        final = self._ended(process)
        text = process.output if process.output is not None else process.text()
        page, next_offset = output_page(text, offset)
        return repeat_result(final, process_id, content=page, next_offset=next_offset)

    def _wait(
        self, ctx: ToolContext, process_id: str, process: CommandProcess, timeout: float
    ) -> ToolResult:
        if not child_processes.wait_for(process.popen, timeout, ctx, kill_on_cancel=False):
            return ToolResult(
                status="pending",
                payload={"process_id": process_id, "running": True, "status": "pending"},
                message="Still running after the wait; it is not finished.",
                outcome="submitted",
            )
        return repeat_result(self._ended(process), process_id)

    def _stop(self, process_id: str, process: CommandProcess) -> ToolResult:
        if child_processes.state(process.popen)[0]:
            # Already over: nothing to stop, the final result stands.
            return repeat_result(self._ended(process), process_id)
        if not child_processes.kill_group(process.popen):
            return ToolResult(
                status="unknown",
                payload={"process_id": process_id, "stopped": False, "status": "unknown"},
                message="The process group was signalled but its end cannot be confirmed.",
                outcome="indeterminate",
            )
        with process.lock:
            if process.final is None:
                process.stopped = True
        payload = self._ended(process).payload
        return ToolResult(
            status="succeeded",  # the stop did what it was asked; the command did not finish
            payload={
                "process_id": process_id,
                "stopped": True,
                "exit_code": payload["exit_code"],
                "output": payload["output"],
                "output_file": payload["output_file"],
            },
            message=(
                f"Stopped before it finished; read and wait now report it as failed. {NOT_UNDONE}"
            ),
            outcome="succeeded",
        )

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(
        self, ctx: ToolContext, args: ExecuteCommandArgs
    ) -> tuple[str, CommandProcess] | ToolResult:
        if args.cwd is not None and not os.path.isdir(args.cwd):
            return ToolResult(
                status="failed",
                message=f"working directory {args.cwd!r} does not exist; nothing was run",
                code="invalid_arguments",
                outcome="invalid_arguments",
            )
        fd, path = tempfile.mkstemp(prefix="orch-command-", suffix=".log")
        try:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", str(args.command)],
                cwd=args.cwd,
                env=child_processes.child_environment(os.environ, self._secrets, args.env),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: timeouts kill all of it
            )
        except OSError as exc:
            delete_output(path)
            return ToolResult(
                status="failed",
                message=f"the command could not be started: {exc.strerror}; nothing was run",
                code="not_started",
                outcome="not_sent",
            )
        finally:
            os.close(fd)  # the child has its own copy; the parent never writes to the file
        process_id = uuid.uuid4().hex
        process = CommandProcess(
            ctx.owner,
            ctx.session_id,
            popen,
            path,
            command=str(args.command),
            secrets=self._secrets,
        )
        with self._lock:
            # Tracked from the first moment, so `reap` finds it whatever happens next.
            self._processes[process_id] = process
        return process_id, process

    def _lookup(self, ctx: ToolContext, process_id: str) -> CommandProcess | None:
        with self._lock:
            process = self._processes.get(process_id)
        if process is None or process.owner != ctx.owner or process.session_id != ctx.session_id:
            return None
        return process

    def _forget(self, process_id: str) -> None:
        with self._lock:
            process = self._processes.pop(process_id, None)
        if process is not None:
            discard(process)

    def _ended(self, process: CommandProcess) -> ToolResult:
        """The final result of a process whose end is confirmed, computed on first use."""
        with process.lock:
            if process.final is not None:
                return process.final
            process.final = final_result(process)
            process.ended_at = time.monotonic()
            final = process.final
        self._evict(process.session_id)
        return final

    def _evict(self, session_id: str) -> None:
        """Keep at most `MAX_FINISHED` finished commands a session; the longest ended go.

        A background command with a receipt is never among them: the round end settles its
        `pending` receipt from `background()`, which must still see it (invariant 23). `reap`
        drops it with its session; a round's tool calls bound how many there are."""
        with self._lock:
            finished = sorted(
                (
                    (entry.ended_at, process_id)
                    for process_id, entry in self._processes.items()
                    if entry.session_id == session_id
                    and entry.final is not None
                    and entry.invocation_id is None
                ),
            )
            excess = finished[: max(0, len(finished) - MAX_FINISHED)]
            evicted = [self._processes.pop(process_id) for _, process_id in excess]
        for entry in evicted:
            discard(entry)


def command_tools(settings: Settings) -> list[Tool]:
    """`execute_command` when `ORCH_ENABLE_COMMAND_TOOL` is set, else nothing."""
    return [ExecuteCommand(secrets_of(settings))] if settings.enable_command_tool else []
