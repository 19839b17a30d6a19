"""Many concurrent agents in one worker process: the threads pool beside prefork, in one run.

Each round is an agent whose model answers every turn after `--turn-delay` seconds (the scripted
model's `delay_s`; a loopback OpenAI-compatible server shows the same waiting). Leases are short
(6 s, renewed every 2 s) so the process's one heartbeat renews every lease several times a
round, and a sweeper runs: a lease renewed late would show as a lost generation.

    .venv/bin/python bench/concurrency.py --executions 200 --prefork 8 --write

Per pool: the worker process group's resident memory (idle, and peak while every execution is
in flight), RSS per concurrent execution, trigger -> start latency of the burst and of probes
triggered one at a time while the load runs, and how the generations ended.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, Processes, Series, servers

AGENT, PROBE = "agent", "probe"
LEASE, RENEW, SWEEP = 6.0, 2.0, 1.0
PROBES = 20


def agent_turns(delay: float) -> list[dict[str, Any]]:
    """A round of five model turns, each answered after `delay` seconds."""
    from tests.executions_support import completing_turns

    return [{**turn, "delay_s": delay} for turn in completing_turns()]


def probe_turns() -> list[dict[str, Any]]:
    from tests.executions_support import node, plan_call, report_call

    return [
        {"tool_calls": [plan_call("c1", "r1", [node("a", "completed")])]},
        {"tool_calls": [report_call("c2", "completed")]},
        {"content": "done"},
    ]


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in the process group `pgid`, MiB."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError, ValueError):
            continue
    return total / 1024


def run_pool(
    pool: str, executions: int, procs: Processes, rt: Any, deadline_s: float
) -> dict[str, Any]:
    from orchestrator.services.tasks import Trigger
    from orchestrator.store import tasks as task_store

    print(f"[{pool}] {executions} concurrent executions", flush=True)
    worker = procs.worker(executions + 1, pool=pool)  # one slot spare for the probes
    until = time.monotonic() + 120
    while not worker.ready():
        if time.monotonic() > until:
            raise RuntimeError(f"{pool} worker not ready:\n{worker.log.read_text()[-3000:]}")
        time.sleep(0.1)
    time.sleep(1.0)
    pgid = worker.process.pid
    idle = group_rss_mb(pgid)
    peak = idle

    def execution_rows(task_ids: list[str]) -> list[Any]:
        with rt.db.transaction(readonly=True) as conn:
            return [e for t in task_ids for e in task_store.list_executions(conn, t)]

    def created(task_ids: list[str]) -> dict[str, Any]:
        return {t: rt.tasks.get(t).created_at for t in task_ids}

    began = time.monotonic()
    task_ids = [
        rt.tasks.trigger(Trigger(task_type=AGENT, title=f"{pool} {n}")).task.task_id
        for n in range(executions)
    ]
    triggered_at = created(task_ids)
    while True:
        peak = max(peak, group_rss_mb(pgid))
        rows = execution_rows(task_ids)
        if sum(1 for e in rows if e.started_at is not None) >= executions:
            break
        if time.monotonic() - began > deadline_s:
            raise RuntimeError(f"{pool}: not all {executions} started")
        time.sleep(0.2)
    burst = Series(
        "burst",
        [
            (e.started_at - triggered_at[e.task_id]).total_seconds() * 1000
            for e in rows
            if e.generation == 1
        ],
    )
    all_started = time.monotonic() - began
    probes = Series("probes")
    for n in range(PROBES):  # one at a time, while the load runs
        probe = rt.tasks.trigger(Trigger(task_type=PROBE, title=f"probe {n}")).task.task_id
        while True:
            peak = max(peak, group_rss_mb(pgid))
            (row,) = execution_rows([probe])[:1] or [None]
            if row is not None and row.started_at is not None:
                break
            time.sleep(0.005)
        probes.samples.append((row.started_at - created([probe])[probe]).total_seconds() * 1000)
    while True:
        peak = max(peak, group_rss_mb(pgid))
        statuses = [rt.tasks.get(t).status for t in task_ids]
        if all(s in {"completed", "failed", "cancelled"} for s in statuses):
            break
        if time.monotonic() - began > deadline_s:
            raise RuntimeError(f"{pool}: not finished in {deadline_s} s")
        time.sleep(0.5)
    elapsed = time.monotonic() - began
    rows = execution_rows(task_ids)
    outcomes: dict[str, int] = {}
    for e in rows:
        outcomes[str(e.outcome)] = outcomes.get(str(e.outcome), 0) + 1
    log = worker.log.read_text(errors="replace")
    worker.stop()
    return {
        "pool": pool,
        "executions": executions,
        "idle_mb": idle,
        "peak_mb": peak,
        "per_execution_mb": peak / executions,
        "added_per_execution_mb": (peak - idle) / executions,
        "burst": burst,
        "probes": probes,
        "all_started_s": all_started,
        "elapsed_s": elapsed,
        "outcomes": outcomes,
        "lost": outcomes.get("lost", 0),
        "completed": statuses.count("completed"),
        "refusals": log.count("lease renewal was refused"),
        "overdue": log.count("older than the lease minus its safety margin"),
    }


def report(
    results: list[dict[str, Any]], command: str, delay: float, load: tuple[float, float]
) -> str:
    lines = [
        "## Concurrent executions per worker process",
        "",
        f"Command: `{command}`",
        "",
        f"Each execution is one agent round of five model turns, each answered after {delay:g} s "
        f"(scripted model `delay_s`); lease {LEASE:g} s renewed every {RENEW:g} s by the "
        f"process's one heartbeat, a sweeper every {SWEEP:g} s. Load average {load[0]:.1f} at "
        f"the start, {load[1]:.1f} at the end (2 cores shared with other work).",
        "",
        "| pool | concurrent executions | RSS idle, MiB | RSS peak, MiB | RSS per execution, MiB "
        "| added per execution, MiB | burst trigger -> start p50 / max, ms "
        "| probe trigger -> start under load p50 / max, ms | generations lost | completed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['pool']} | {r['executions']} | {r['idle_mb']:.0f} | {r['peak_mb']:.0f} | "
            f"{r['per_execution_mb']:.2f} | {r['added_per_execution_mb']:.2f} | "
            f"{r['burst'].p50:.0f} / {max(r['burst'].samples):.0f} | "
            f"{r['probes'].p50:.1f} / {max(r['probes'].samples):.1f} | {r['lost']} | "
            f"{r['completed']}/{r['executions']} |"
        )
    threads = next((r for r in results if r["pool"] == "threads"), None)
    if threads is not None:
        met = threads["lost"] == 0 and threads["peak_mb"] <= 400 and threads["executions"] >= 200
        lines += [
            "",
            f"Goal (issue 15): one process holds >= 200 concurrent executions, 0 generations "
            f"lost, RSS <= 400 MB: **{'met' if met else 'NOT met'}** "
            f"({threads['executions']} executions, {threads['lost']} lost, "
            f"{threads['peak_mb']:.0f} MiB peak; renewals refused: {threads['refusals']}, "
            f"overdue: {threads['overdue']}). All {threads['executions']} were running "
            f"{threads['all_started_s']:.1f} s after the burst was triggered; the run took "
            f"{threads['elapsed_s']:.1f} s.",
        ]
    lines += [
        "",
        "- RSS is the whole process group (prefork: the parent and every pool child). Per "
        "execution = peak / concurrent executions; added = (peak - idle) / executions.",
        "- Burst: all executions triggered at once through the service; trigger -> start is "
        "the execution's `started_at` minus the task's `created_at`. Probes: "
        f"{PROBES} minimal rounds triggered one at a time while the load runs, on the spare slot.",
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
    from tests.executions_support import settings_for, write_script
    from workers.celery_app import CeleryDispatcher, make_celery

    load_start = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="orch-bench-conc-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        _pg, pg_url, redis_url, _template = stack.enter_context(servers())
        scripts = folder / "scripts"
        write_script(scripts, AGENT, agent_turns(args.turn_delay))
        write_script(scripts, PROBE, probe_turns())
        env = {
            "ORCH_DATABASE_URL": pg_url,
            "ORCH_REDIS_URL": redis_url,
            "ORCH_MODEL": f"scripted:{scripts}",
            "ORCH_LEASE_SECONDS": str(LEASE),
            "ORCH_LEASE_RENEW_SECONDS": str(RENEW),
            "ORCH_SWEEP_SECONDS": str(SWEEP),
            "ORCH_QUEUED_STALE_SECONDS": "60",
            "ORCH_HOME": str(folder / "home"),
        }
        procs = Processes(folder, env)
        stack.callback(procs.stop_all)
        settings = settings_for(pg_url, scripts, redis_url=redis_url, home=folder / "home")
        rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
        stack.callback(rt.close)
        procs.sweeper()
        deadline = 60 + 10 * args.turn_delay * 5
        results = [run_pool("threads", args.executions, procs, rt, deadline)]
        if args.prefork:
            results.append(run_pool("prefork", args.prefork, procs, rt, deadline))
    section = report(results, command, args.turn_delay, (load_start, os.getloadavg()[0]))
    print(section)
    if args.write:
        write_section("concurrency", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
