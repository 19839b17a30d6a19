"""CPU time of this machine's processes, from /proc, summed by role (Linux only)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "cpu_used"]


def cpu_seconds(roles: dict[int, str], servers: dict[int, str] | None = None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by every live process and the children it
    reaped, summed by role: the pids in `roles` and their children take the pid's role,
    `postgres` and `redis-server` processes their own; this process is `bench`.

    With `servers` (the pids of the benchmark's own Postgres postmaster and redis-server, and
    their roles), only those servers and their children count as `postgres` and `redis`: on
    a shared machine other people's servers (their test runs) would otherwise be charged to
    whichever side is being measured, and most to the side whose burst lasts longest."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid], names[pid] = int(fields[1]), name
        used[pid] = sum(int(value) for value in fields[11:15]) / tick  # u, s, reaped u, s
    totals: dict[str, float] = {}
    for pid, seconds in used.items():
        role = {"postgres": "postgres", "redis-server": "redis"}.get(names[pid])
        if servers is not None and role is not None:
            role = _server_role(pid, parents, servers)
            if role is None:
                continue  # a server that is not the benchmark's
        if pid == os.getpid():
            role = "bench"
        ancestor = pid
        while role is None and ancestor > 1:
            if ancestor in roles:
                role = roles[ancestor] if ancestor == pid else roles[ancestor] + " children"
            ancestor = parents.get(ancestor, 0)
        if role is not None:
            totals[role] = totals.get(role, 0.0) + seconds
    return totals


def _server_role(pid: int, parents: dict[int, int], servers: dict[int, str]) -> str | None:
    ancestor = pid
    while ancestor > 1:
        if ancestor in servers:
            return servers[ancestor]
        ancestor = parents.get(ancestor, 0)
    return None


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {role: after[role] - before.get(role, 0.0) for role in after}
