"""Many concurrent agents in one worker process on the real model client: threads beside prefork.

The worker runs `ORCH_MODEL=openai:<model>` against the loopback OpenAI-compatible server of
the tests (tests/openai_server.py, a thread per connection), which answers every turn after
`--turn-delay` seconds; each round is five such turns. Leases are short (6 s, renewed every
2 s) so the process's one heartbeat renews every lease several times a round, and a sweeper
runs: a lease renewed late shows as a lost generation and in the worker's log.

    .venv/bin/python bench/concurrency.py --executions 200 --prefork 8 --write

Per pool: the worker process group's resident memory (idle, and peak while the executions are
in flight), RSS per concurrent execution, its threads and open files, the most executions
running at one moment, trigger -> start latency of the burst and of probes triggered one at a
time while the load runs, how the generations ended and how many renewals were late.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, Processes, Series, servers

AGENT, PROBE = "agent", "probe"
MODEL = "bench-model"
LEASE, RENEW, SWEEP = 6.0, 2.0, 1.0
PROBES, PROBE_SLOTS = 20, 2
#: The issue's memory goal, in MB (10^6 bytes; 400 MB is 381.5 MiB).
GOAL_MB = 400
MIB = 1024 * 1024 / 1e6  # MB per MiB
#: What the worker logs when a generation stops because its lease is in doubt.
REFUSED = "the lease renewal was refused"
OVERDUE = "older than the lease minus its safety margin"


@dataclass
class Group:
    """The worker's process group at one moment: memory, threads, open files."""

    rss_mb: float = 0.0
    threads: int = 0
    fds: int = 0

    def peak(self, other: Group) -> Group:
        return Group(
            max(self.rss_mb, other.rss_mb),
            max(self.threads, other.threads),
            max(self.fds, other.fds),
        )


def sample_group(pgid: int) -> Group:
    """Resident memory (MiB), threads and open files of every process in the group `pgid`."""
    rss_kb = threads = fds = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kb += int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
            fds += len(os.listdir(entry / "fd"))
        except (OSError, ProcessLookupError, ValueError):
            continue
    return Group(rss_kb / 1024, threads, fds)


@dataclass(frozen=True)
class Row:
    task_id: str
    generation: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None


def execution_rows(rt: Any, task_ids: list[str]) -> list[Row]:
    """Every execution of `task_ids` with its task's trigger time, in one query."""
    from sqlalchemy import select

    from orchestrator.store.tables import executions, tasks

    query = (
        select(
            executions.c.task_id,
            executions.c.generation,
            tasks.c.created_at,
            executions.c.started_at,
            executions.c.ended_at,
            executions.c.outcome,
        )
        .join(tasks, tasks.c.task_id == executions.c.task_id)
        .where(executions.c.task_id.in_(task_ids))
    )
    with rt.db.transaction(readonly=True) as conn:
        return [Row(*row) for row in conn.execute(query)]


def in_flight(rows: list[Row]) -> int:
    return sum(1 for r in rows if r.started_at is not None and r.ended_at is None)


def start_ms(row: Row) -> float:
    assert row.started_at is not None
    return (row.started_at - row.created_at).total_seconds() * 1000


def probe_turns() -> list[dict[str, Any]]:
    """A short round: a query, a plan of one completed node citing it, a report, the answer."""
    from tests.executions_support import node, plan_call, query_call, report_call

    return [
        {"tool_calls": [query_call()]},
        {"tool_calls": [plan_call("c1", "r1", [node("a", "completed")])]},
        {"tool_calls": [report_call("c2", "completed")]},
        {"content": "done"},
    ]


def run_pool(
    pool: str, executions: int, procs: Processes, rt: Any, deadline_s: float
) -> dict[str, Any]:
    from orchestrator.services.tasks import Trigger

    print(f"[{pool}] {executions} concurrent executions", flush=True)
    worker = procs.worker(executions + PROBE_SLOTS, pool=pool)  # spare slots for the probes
    until = time.monotonic() + 120
    while not worker.ready():
        if time.monotonic() > until:
            raise RuntimeError(f"{pool} worker not ready:\n{worker.log.read_text()[-3000:]}")
        time.sleep(0.1)
    time.sleep(1.0)
    pgid = worker.process.pid
    idle = sample_group(pgid)
    peak = idle
    most = 0

    def watch(task_ids: list[str]) -> list[Row]:
        nonlocal peak, most
        peak = peak.peak(sample_group(pgid))
        rows = execution_rows(rt, task_ids)
        most = max(most, in_flight(rows))
        return rows

    began = time.monotonic()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type=AGENT, title=f"{pool} {n}")).task.task_id
        for n in range(executions)
    ]
    while True:
        rows = watch(task_ids)
        if sum(1 for r in rows if r.started_at is not None) >= executions:
            break
        if time.monotonic() - began > deadline_s:
            raise RuntimeError(f"{pool}: not all {executions} started")
        time.sleep(0.2)
    burst = Series("burst", [start_ms(r) for r in rows if r.generation == 1])
    all_started = time.monotonic() - began
    probes = Series("probes")
    probe_ids: list[str] = []
    for n in range(PROBES):  # one at a time, while the load runs, each on a free slot
        while probe_ids and in_flight(execution_rows(rt, probe_ids)) >= PROBE_SLOTS:
            time.sleep(0.005)
        probe = rt.tasks.trigger(Trigger(task_type=PROBE, title=f"probe {n}")).task.task_id
        probe_ids.append(probe)
        while True:
            (row,) = execution_rows(rt, [probe])[:1] or [None]
            if row is not None and row.started_at is not None:
                break
            time.sleep(0.005)
        probes.samples.append(start_ms(row))
        watch(task_ids + probe_ids)
    while True:
        rows = watch(task_ids + probe_ids)
        if all(r.ended_at is not None for r in rows if r.started_at is not None) and all(
            r.started_at is not None for r in rows
        ):
            break
        if time.monotonic() - began > deadline_s:
            raise RuntimeError(f"{pool}: not finished in {deadline_s} s")
        time.sleep(0.2)
    elapsed = time.monotonic() - began
    statuses = [rt.tasks.get(t).status for t in task_ids + probe_ids]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[str(r.outcome)] = outcomes.get(str(r.outcome), 0) + 1
    log = worker.log.read_text(errors="replace")
    worker.stop()
    total = executions + PROBES
    load_end = max(r.ended_at for r in rows if r.task_id in set(task_ids) and r.ended_at)
    probes_under_load = sum(
        1 for r in rows if r.task_id in set(probe_ids) and r.started_at and r.started_at < load_end
    )
    return {
        "pool": pool,
        "executions": executions,
        "most_in_flight": most,
        "idle": idle,
        "peak": peak,
        "per_execution_mb": peak.rss_mb / max(most, 1),
        "added_per_execution_mb": (peak.rss_mb - idle.rss_mb) / max(most, 1),
        "burst": burst,
        "probes": probes,
        "probes_under_load": probes_under_load,
        "all_started_s": all_started,
        "elapsed_s": elapsed,
        "outcomes": outcomes,
        "lost": outcomes.get("lost", 0),
        "total": total,
        "completed": statuses.count("completed"),
        "refused": log.count(REFUSED),
        "overdue": log.count(OVERDUE),
    }


def report(results: list[dict[str, Any]], command: str, delay: float, load: Any) -> str:
    lines = [
        "## Concurrent executions per worker process",
        "",
        f"Command: `{command}`",
        "",
        f"Each execution is one agent round of five model turns on the real model client "
        f"(`ORCH_MODEL=openai:{MODEL}`, the `openai` package over HTTP) against a loopback "
        f"OpenAI-compatible server (tests/openai_server.py, a thread per connection) that "
        f"answers every turn after {delay:g} s; lease {LEASE:g} s renewed every {RENEW:g} s by "
        f"the process's one heartbeat, a sweeper every {SWEEP:g} s. Load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (2 cores shared with other "
        "work).",
        "",
        "| pool | executions (most at once) | RSS idle, MiB | RSS peak, MiB "
        "| RSS per execution, MiB | added per execution, MiB | threads / open files at peak "
        "| burst trigger -> start p50 / p99 / max, ms "
        "| probe trigger -> start under load p50 / p99 / max, ms | generations lost "
        "| renewals late (overdue / refused) | completed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        b, p = r["burst"], r["probes"]
        lines.append(
            f"| {r['pool']} | {r['executions']} ({r['most_in_flight']}) | "
            f"{r['idle'].rss_mb:.0f} | {r['peak'].rss_mb:.0f} | "
            f"{r['per_execution_mb']:.2f} | {r['added_per_execution_mb']:.2f} | "
            f"{r['peak'].threads} / {r['peak'].fds} | "
            f"{b.p50:.0f} / {b.p99:.0f} / {max(b.samples):.0f} | "
            f"{p.p50:.0f} / {p.p99:.0f} / {max(p.samples):.0f} | {r['lost']} | "
            f"{r['overdue']} / {r['refused']} | {r['completed']}/{r['total']} |"
        )
    threads = next((r for r in results if r["pool"] == "threads"), None)
    if threads is not None:
        late = threads["overdue"] + threads["refused"]
        peak_mb = threads["peak"].rss_mb * MIB
        met = (
            threads["lost"] == 0
            and late == 0
            and peak_mb <= GOAL_MB
            and threads["most_in_flight"] >= 200
            and delay >= 2
        )
        lines += [
            "",
            f"Goal (issue 15): one process holds >= 200 concurrent executions against an "
            f"OpenAI-compatible server answering after 2 s, every lease renewed in time, 0 "
            f"generations lost, RSS <= {GOAL_MB} MB: **{'met' if met else 'NOT met'}** (at most "
            f"{threads['most_in_flight']} running at once on {delay:g} s turns, "
            f"{threads['lost']} lost, {late} late renewals, peak "
            f"{threads['peak'].rss_mb:.0f} MiB = {peak_mb:.0f} MB). "
            f"All {threads['executions']} "
            f"were running {threads['all_started_s']:.1f} s after the burst was triggered; the "
            f"run took {threads['elapsed_s']:.1f} s.",
        ]
    lines += [
        "",
        "- RSS is the whole process group (prefork: the parent and every pool child). Per "
        "execution = peak / most executions running at once (read from the store's "
        "`started_at` / `ended_at` while the load runs); added = (peak - idle) / the same.",
        "- Burst: all executions triggered at once through the service; trigger -> start is "
        "the execution's `started_at` minus the task's `created_at`. Probes: "
        f"{PROBES} short rounds (four turns answered at once) triggered one at a time while "
        f"the load runs, each when one of {PROBE_SLOTS} spare slots is free (the worker's "
        f"concurrency is executions + {PROBE_SLOTS}); probes that started before the load's "
        "last round ended: "
        + ", ".join(f"{r['pool']} {r['probes_under_load']}/{PROBES}" for r in results)
        + ".",
        "- Late renewals: generations the worker stopped because their last good renewal was "
        "older than the lease minus its safety margin (overdue), or because a renewal was "
        "refused (the sweeper had taken the lease).",
        "- The model client is one `openai.OpenAI` (one httpx pool) per process and server, "
        "shared by every round; the calls run on a process-wide pool of threads that grows "
        "with the rounds waiting on the model.",
        "- Prefork runs one execution per process, so it is measured with fewer processes; "
        "its per-execution memory is what a fleet of that many would need.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=200, help="threads: concurrent rounds")
    parser.add_argument("--prefork", type=int, default=8, help="prefork: processes (0: skip)")
    parser.add_argument("--turn-delay", type=float, default=2.0, help="seconds per model turn")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    command = (
        f".venv/bin/python bench/concurrency.py --executions {args.executions} --prefork "
        f"{args.prefork} --turn-delay {args.turn_delay:g}{' --write' if args.write else ''}"
    )
    from orchestrator.runtime import build_runtime
    from tests.executions_support import completing_turns, settings_for
    from tests.openai_server import OpenAIServer, replies
    from workers.celery_app import CeleryDispatcher, make_celery

    load_start = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="orch-bench-conc-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        _pg, pg_url, redis_url, _template = stack.enter_context(servers())
        model = stack.enter_context(OpenAIServer(MODEL))
        model.converse(replies(probe_turns()), mentioning=f"({PROBE})")
        slow = [replace(r, delay_s=args.turn_delay) for r in replies(completing_turns())]
        model.converse(slow)
        env = {
            "ORCH_DATABASE_URL": pg_url,
            "ORCH_REDIS_URL": redis_url,
            "ORCH_MODEL": f"openai:{MODEL}",
            "LLM_BASE_URL": model.base_url,
            "ORCH_LEASE_SECONDS": str(LEASE),
            "ORCH_LEASE_RENEW_SECONDS": str(RENEW),
            "ORCH_SWEEP_SECONDS": str(SWEEP),
            "ORCH_QUEUED_STALE_SECONDS": "60",
            "ORCH_HOME": str(folder / "home"),
        }
        procs = Processes(folder, env)
        stack.callback(procs.stop_all)
        settings = settings_for(pg_url, folder, redis_url=redis_url, home=folder / "home")
        rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
        stack.callback(rt.close)
        procs.sweeper()
        deadline = 60 + 10 * args.turn_delay * 5
        results = [run_pool("threads", args.executions, procs, rt, deadline)]
        if args.prefork:
            results.append(run_pool("prefork", args.prefork, procs, rt, deadline))
        print(f"model server: {len(model.requests)} requests", flush=True)
    section = report(results, command, args.turn_delay, (load_start, os.getloadavg()[0]))
    print(section)
    if args.write:
        write_section("concurrency", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
