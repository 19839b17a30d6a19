"""One command of `execute_command`, from its spawn until it is forgotten, and how its end is
told (seed 000, invariant 18): `succeeded` only on a normal exit with code 0; a non-zero exit, a
signal, a timeout that stopped it or a `stop` is `failed`; an end that cannot be confirmed, or
one whose exit status something else collected, is `unknown`. Once confirmed, the final result
is computed once, and every later read, wait or stop repeats it (`repeat_result`).

The tool that spawns, tracks and reaps them is `orchestrator.tools.command`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.domain.outcomes import Outcome, model_message, tool_status
from orchestrator.tools import child_processes
from orchestrator.tools.base import ToolResult
from orchestrator.tools.command_output import (
    MASKED_OUTPUT,
    PREVIEW,
    delete_output,
    output_preview,
    read_output,
)

__all__ = [
    "NOT_UNDONE",
    "CommandProcess",
    "discard",
    "final_result",
    "repeat_result",
    "unconfirmed_result",
]

NOT_UNDONE = "A timeout or cancellation does not undo what the command already did."

log = logging.getLogger(__name__)


@dataclass
class CommandProcess:
    """One command, from its spawn until `reap` (or eviction) forgets it."""

    owner: str
    session_id: str
    popen: subprocess.Popen[bytes]
    path: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    timed_out: bool = False  # a run's timeout signalled it: never a success afterwards
    stopped: bool = False  # `stop` ended it
    final: ToolResult | None = None
    ended_at: float = 0.0
    output: str | None = None  # the whole output once ended, when short enough to drop the file
    invocation_id: str | None = None  # the receipt of a background `start`, settled at round end
    command: str = ""  # the command line, for the evidence record of its output
    secrets: tuple[str, ...] = ()  # masked in every read of the output (`read_output`)
    masked: bool = False  # one was found in the output: its results say so (`MASKED_OUTPUT`)

    def text(self) -> str:
        """The output so far, whole, its secrets masked."""
        text, masked = read_output(self.path, self.secrets)
        self.masked = self.masked or masked
        return text

    def said(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload`, saying a secret was masked in the output when one was."""
        return {**payload, "secrets_masked": MASKED_OUTPUT} if self.masked else payload


def final_result(process: CommandProcess) -> ToolResult:
    """The result of a command whose end is confirmed (short output: the file goes now)."""
    _, code = child_processes.state(process.popen)
    outcome: Outcome
    if process.timed_out:
        outcome, execution = "command_failed", "timed_out_and_stopped"
    elif process.stopped:
        outcome, execution = "command_failed", "stopped"
    elif code is None:
        # Something else in this process collected the exit status: it ended, but how is lost.
        outcome, execution = "indeterminate", "exit_status_lost"
    elif code == 0:
        outcome, execution = "succeeded", "exited"
    else:
        outcome = "command_failed"
        execution = "exited" if code > 0 else "killed_by_signal"
    status = tool_status(outcome)
    text = process.text()
    output_file: str | None = None
    if len(text) > PREVIEW:
        output_file = process.path  # kept for `read` paging until `reap`
    else:
        process.output = text
        delete_output(process.path)
    payload: dict[str, Any] = {
        "exit_code": code,
        "timed_out": process.timed_out,
        "execution_outcome": execution,
        "status": status,
        "output": output_preview(text),
        "output_file": output_file,
    }
    if process.timed_out or process.stopped:
        payload["note"] = NOT_UNDONE
    return ToolResult(
        status=status,
        payload=process.said(payload),
        message=model_message(outcome),
        outcome=outcome,
    )


def unconfirmed_result(process: CommandProcess, process_id: str) -> ToolResult:
    """A run whose end cannot be confirmed: `unknown`; the file stays for later reads."""
    payload: dict[str, Any] = {
        "process_id": process_id,
        "exit_code": None,
        "timed_out": process.timed_out,
        "execution_outcome": "unconfirmed",
        "status": "unknown",
        "output": output_preview(process.text()),
        "output_file": process.path,
        "note": NOT_UNDONE,
    }
    return ToolResult(
        status="unknown",
        payload=process.said(payload),
        message=model_message("indeterminate"),
        outcome="indeterminate",
    )


def repeat_result(
    final: ToolResult, process_id: str, running: bool | None = False, **extra: Any
) -> ToolResult:
    """The final result again, for a read, wait or stop after the end."""
    payload = {**final.payload, "process_id": process_id, **extra}
    if running is not None:
        payload["running"] = running
    return replace(final, payload=payload)


def discard(process: CommandProcess) -> None:
    """Kill what is left of the process group and delete the output file."""
    ended, code = child_processes.state(process.popen)
    if not ended and not child_processes.kill_group(process.popen):
        log.warning("command process %s did not end when reaped", process.popen.pid)
    # Children an ended leader left behind. Safe while the unreaped leader holds the id; not
    # when something else collected its status (the id may belong to another process now).
    if not (ended and code is None):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.popen.pid, signal.SIGKILL)
    if child_processes.state(process.popen)[0]:
        with contextlib.suppress(ChildProcessError):
            process.popen.wait(timeout=child_processes.KILL_GRACE)  # reap the zombie
    delete_output(process.path)
