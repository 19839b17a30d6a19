"""A command's child process, in its own process group, watched without being reaped.

Its exit status is looked at (`waitid` with `WNOWAIT`) but never collected, so the leader's
pid, which is also the process-group id, cannot be reused by another process before its owner
kills what is left of the group and reaps it. Ending one is TERM, then KILL, to the whole group,
and counts only once the end is confirmed.

Its environment is the worker's without the orchestrator's own settings (`ORCH_*`, `LLM_*`),
which hold its secrets (the model's API key, the API tokens, the store's URL with its password,
the outbox secrets), nor any other variable whose value holds one (`child_environment`): a
command the model runs, or a task's context talks it into, must not read them (`env`,
`curl ...?k=$LLM_API_KEY`). The variables a call sets itself (its `env`) are added on top.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping

from orchestrator.logs import distinctive
from orchestrator.tools.base import ToolCancelled, ToolContext

__all__ = ["KILL_GRACE", "TERM_GRACE", "child_environment", "kill_group", "state", "wait_for"]

_POLL = 0.05
TERM_GRACE = 2.0
KILL_GRACE = 3.0
#: The prefixes of the orchestrator's settings (`orchestrator.settings`) in the environment.
_OWN_SETTINGS = ("ORCH_", "LLM_")


def child_environment(
    parent: Mapping[str, str], secrets: Iterable[str], extra: Mapping[str, str]
) -> dict[str, str]:
    """`parent` without the orchestrator's settings and any variable that holds one of
    `secrets`, then `extra`. A variable holds a secret when its value is the secret, names it as
    a URL's password (`:secret@`), or contains it anywhere when it cannot be a word
    (`orchestrator.logs.distinctive`): a store password `postgres` is in PGPASSWORD and in a
    database URL, and also in a PATH through `/usr/lib/postgresql`, which must stay."""
    plain = [secret for secret in secrets if len(secret) >= 4]

    def holds(value: str, secret: str) -> bool:
        if distinctive(secret):
            return secret in value
        return value == secret or f":{secret}@" in value

    kept = {
        name: value
        for name, value in parent.items()
        if not name.upper().startswith(_OWN_SETTINGS)
        and not any(holds(value, secret) for secret in plain)
    }
    return {**kept, **extra}


def state(popen: subprocess.Popen[bytes]) -> tuple[bool, int | None]:
    """(ended, exit code), without reaping: the zombie keeps the pid (and so the process-group
    id) from being reused until its owner reaps it. A negative code is the signal that ended it;
    None with ended=True means something else collected the status."""
    if popen.returncode is not None:
        return True, popen.returncode
    try:
        info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True, None
    if info is None:
        return False, None
    if info.si_code == os.CLD_EXITED:
        return True, info.si_status
    return True, -info.si_status


def wait_for(
    popen: subprocess.Popen[bytes], timeout: float, ctx: ToolContext, *, kill_on_cancel: bool = True
) -> bool:
    """True when the process ended within `timeout`; raises `ToolCancelled` on cancellation."""
    deadline = time.monotonic() + timeout
    while True:
        if state(popen)[0]:
            return True
        if ctx.cancel is not None and ctx.cancel.is_set():
            if kill_on_cancel:
                kill_group(popen)
            raise ToolCancelled("cancelled while the command ran")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if ctx.cancel is not None:
            ctx.cancel.wait(min(_POLL, remaining))
        else:
            time.sleep(min(_POLL, remaining))


def _ends_within(popen: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not state(popen)[0]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(_POLL, remaining))
    return True


def kill_group(popen: subprocess.Popen[bytes]) -> bool:
    """TERM then KILL the process group; True only when the end of the process is confirmed."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, KILL_GRACE)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig)
        if _ends_within(popen, grace):
            return True
    return state(popen)[0]
