"""Which process holds a generation, and whether that process still exists.

A claim records the host name, the pid and the process's start: on Linux the boot id, the pid
namespace and the start time in clock ticks since boot (`/proc/<pid>/stat`, field 22). A pid
is reused only by a process that started later, and a start time is only comparable within
one boot and one pid namespace, so a process is taken for gone only when all of these hold:

- the host name, the boot id and the pid namespace are this process's own (another machine,
  a reboot, or another container sharing the host name is never judged from here);
- `/proc/<pid>/stat` is missing, shows a zombie with no other thread left (a thread group
  leader that ended shows as a zombie while its other threads run), or shows a different start
  time; when /proc does not show it (mounted with `hidepid`, a process of another user), only
  a signal 0 that finds no such process says it is gone.

Anywhere else (no `/proc`), `started` is None and no process is ever judged gone: recovery then
waits for the lease to run out, as it always did.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path

from orchestrator.domain.processes import ProcessIdentity

__all__ = ["ProcessIdentity", "current_process", "is_gone", "local_scope", "pid_exists"]

_PROC = Path("/proc")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """The start time of `pid` in ticks since boot; None when it is gone or a zombie."""
    stat = _read(_PROC / str(pid) / "stat")
    if stat is None:
        return None
    return _ticks_of(stat)


def _ticks_of(stat: str) -> str | None:
    # The command name is in parentheses and may hold spaces: fields start after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] == "X" or (fields[0] == "Z" and int(fields[17]) <= 1):
        return None  # a zombie leader whose other threads run (num_threads, field 20) lives on
    return fields[19]  # field 22 of the whole line: starttime


@cache
def local_scope() -> str | None:
    """Boot id and pid namespace of this process: where its pids and start times mean something."""
    boot = _read(_PROC / "sys" / "kernel" / "random" / "boot_id")
    try:
        namespace = os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return None
    if not boot:
        return None
    return f"{boot}:{namespace.removeprefix('pid:').strip('[]')}"


_current: ProcessIdentity | None = None


def current_process() -> ProcessIdentity:
    """This process, as a claim records it (read once per process, again after a fork)."""
    global _current
    pid = os.getpid()
    if _current is None or _current.pid != pid:
        scope, ticks = local_scope(), _start_ticks(pid)
        started = f"{scope}/{ticks}" if scope is not None and ticks is not None else None
        _current = ProcessIdentity(socket.gethostname(), pid, started)
    return _current


def is_gone(holder: ProcessIdentity) -> bool:
    """True only when `holder` surely no longer runs (see the module docstring)."""
    if holder.started is None or holder.host != socket.gethostname():
        return False
    scope, _, ticks = holder.started.rpartition("/")
    if scope != local_scope():
        return False
    stat = _read(_PROC / str(holder.pid) / "stat")
    if stat is None:
        # Unreadable or hidden is not missing: /proc may hide another user's processes.
        return not pid_exists(holder.pid)
    return _ticks_of(stat) != ticks


def pid_exists(pid: int) -> bool:
    """Whether any process has `pid` here (signal 0: nothing is sent; EPERM means it exists).
    0 and negative numbers name process groups, not a process: taken as existing."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
