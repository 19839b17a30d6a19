"""What a minimal execution costs Postgres with thousands of tasks queued behind it and
hundreds running beside it, with the executions' lease index of migration 0030 and with the one
before it, in the same run.

    .venv/bin/python bench/backlog.py [--history 5000] [--running 300] [--backlog 3000]
        [--executions 100] [--write]

A throwaway Postgres (the tests' local binaries) and Redis; a store of `--history` tasks whose
generations all ended, analysed (the statistics a large installation's last analyse left), and
autovacuum off on `tasks` and `executions`, so those statistics stay as they were while the
queue grows, as they do on a large table between two analyses; then `--running` of them are
marked running (other workers' rounds, as the task rows say). Minimal executions (query,
plan, report; the scripted model) run in this process through the execution service, first
with nothing queued (each task triggered just before it runs), then with `--backlog` tasks
queued behind them; the two indexes alternate within each. Per execution: Postgres's CPU
(its processes' user + system time), the rows the `executions` and `tasks` tables gave their
scans (`pg_stat_user_tables`, read once the runtime's sessions have ended), and this
process's CPU. `--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import cpu
import execution_fleet
from docs_section import write_section
from execution_fleet import LEASE, MINIMAL, RENEW, SWEEP, minimal_turns, servers

from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import Trigger
from orchestrator.store import Database
from tests.executions_support import settings_for, write_script

INDEXES = {
    "0030 (claimed open generations)": (
        "CREATE INDEX ix_executions_open_leases ON executions (lease_expires_at)"
        " WHERE outcome IS NULL AND lease_expires_at IS NOT NULL"
    ),
    "before 0030 (every open execution)": (
        "CREATE INDEX ix_executions_outcome_lease_expires_at ON executions"
        " (outcome, lease_expires_at)"
    ),
}


@contextmanager
def _session(url: str) -> Iterator[Any]:
    """An autocommit connection of its own, closed after: the rows its statements read reach
    `pg_stat_user_tables` when it ends, before a cell is measured, not during it."""
    db = Database.from_url(url)
    try:
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn
    finally:
        db.dispose()


def _use(url: str, index: str) -> None:
    """Only `index`'s lease index on executions."""
    with _session(url) as conn:
        conn.exec_driver_sql("DROP INDEX IF EXISTS ix_executions_open_leases")
        conn.exec_driver_sql("DROP INDEX IF EXISTS ix_executions_outcome_lease_expires_at")
        conn.exec_driver_sql(INDEXES[index])


def _rows_read(url: str) -> dict[str, int]:
    """Rows `executions` and `tasks` gave their scans so far: every other session of the
    database is ended first (a session's counts reach the view when it ends)."""
    with _session(url) as conn:
        others = (
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        for (pid,) in conn.exec_driver_sql(others).all():
            conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
        deadline = time.monotonic() + 10
        while conn.exec_driver_sql(others).first() is not None:
            if time.monotonic() > deadline:
                raise SystemExit("the runtime's sessions did not end")
            time.sleep(0.05)
        conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        rows = conn.exec_driver_sql(
            "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_user_tables WHERE relname IN ('executions', 'tasks')"
        ).all()
    return {str(name): int(count) for name, count in rows}


def _trigger(rt: Runtime, count: int, title: str) -> list[str]:
    return [
        rt.tasks.trigger(Trigger(task_type=MINIMAL, title=title)).task.task_id for _ in range(count)
    ]


def _cell(settings: Any, url: str, queued: list[str] | None, count: int) -> dict[str, float]:
    """`count` executions, of tasks from `queued` (taken from its front) or, without it, each
    triggered just before it runs: per execution, Postgres's and this process's CPU (ms) and
    the rows each table gave."""
    before_rows = _rows_read(url)
    rt = build_runtime(settings, dispatcher=RecordingDispatcher())
    own: list[float] = []
    try:
        before = cpu.cpu_seconds({}, execution_fleet.SERVER_PIDS)
        for _ in range(count):
            task_id = queued.pop(0) if queued is not None else _trigger(rt, 1, "now")[0]
            started = time.process_time()
            result = rt.executions.run(task_id, 1, worker="bench", first_delivery=True)
            own.append((time.process_time() - started) * 1000)
            if result.outcome != "completed":
                raise SystemExit(f"an execution ended {result.outcome}: {result}")
        used = cpu.cpu_used(before, cpu.cpu_seconds({}, execution_fleet.SERVER_PIDS))
    finally:
        rt.close()
    after_rows = _rows_read(url)
    return {
        "postgres_ms": used.get("postgres", 0.0) * 1000 / count,
        "process_ms": statistics.median(own),
        **{f"{t}_rows": (after_rows[t] - before_rows[t]) / count for t in after_rows},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=5000, help="ended tasks, analysed")
    parser.add_argument("--running", type=int, default=300, help="tasks running beside")
    parser.add_argument("--backlog", type=int, default=3000, help="tasks queued behind")
    parser.add_argument("--executions", type=int, default=100, help="per cell")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        with ExitStack() as stack:
            _, pg_url, redis_url, _ = stack.enter_context(servers(False))
            write_script(folder / "scripts", MINIMAL, minimal_turns())
            settings = settings_for(
                pg_url,
                folder / "scripts",
                redis_url=redis_url,
                lease_seconds=LEASE,
                lease_renew_seconds=RENEW,
                sweep_seconds=SWEEP,
                queued_stale_seconds=600,
                home=folder / "home",
            )
            rt = build_runtime(settings, dispatcher=RecordingDispatcher())
            try:
                _trigger(rt, args.history, "past")
                with _session(pg_url) as conn:
                    conn.exec_driver_sql(
                        "UPDATE executions SET outcome = 'completed', started_at = now(),"
                        " ended_at = now()"
                    )
                    conn.exec_driver_sql("UPDATE tasks SET status = 'completed'")
                with _session(pg_url) as c:
                    c.exec_driver_sql("VACUUM ANALYZE tasks, executions")
                    for table in ("tasks", "executions"):
                        c.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                    c.exec_driver_sql(
                        "UPDATE tasks SET status = 'running' WHERE task_id IN"
                        f" (SELECT task_id FROM tasks ORDER BY task_id LIMIT {int(args.running)})"
                    )
                queued: list[str] = []
                for phase in ("nothing queued", f"{args.backlog:,} queued"):
                    if phase != "nothing queued":
                        queued = _trigger(rt, args.backlog + 4 * args.executions, "queued")
                    for index in [*INDEXES, *INDEXES]:
                        _use(pg_url, index)
                        cell = _cell(settings, pg_url, queued if queued else None, args.executions)
                        results.setdefault((phase, index), []).append(cell)
                        print(phase, "|", index, "|", {k: round(v, 2) for k, v in cell.items()})
            finally:
                rt.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = _section(args, results)
    print(section)
    if args.write:
        write_section("backlog", section)
    return 0


def _section(
    args: argparse.Namespace, results: dict[tuple[str, str], list[dict[str, float]]]
) -> str:
    def mean(key: tuple[str, str], field: str) -> float:
        return statistics.fmean(cell[field] for cell in results[key])

    load = os.getloadavg()[0]
    lines = [
        "## Executions behind a queued backlog (bench/backlog.py)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (load average"
        f" {load:.1f} at the end). Command: `.venv/bin/python bench/backlog.py --history"
        f" {args.history} --running {args.running} --backlog {args.backlog} --executions"
        f" {args.executions} --write`.",
        "",
        "| queue | executions' lease index | Postgres CPU per execution, ms | `executions` rows"
        " read | `tasks` rows read | this process's CPU, ms p50 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for phase, index in results:
        key = (phase, index)
        lines.append(
            f"| {phase} | {index} | {mean(key, 'postgres_ms'):.2f} |"
            f" {mean(key, 'executions_rows'):.0f} | {mean(key, 'tasks_rows'):.0f} |"
            f" {mean(key, 'process_ms'):.2f} |"
        )
    lines += [
        "",
        f"- A store of {args.history:,} tasks whose generations ended, analysed, then autovacuum"
        " off on both tables: the statistics a large installation's last analyse left, kept while"
        " the queue grows (on a large table the next analyse waits for a tenth of it to change);"
        f" {args.running:,} of them then marked running, as other workers' rounds are.",
        f"- {args.executions} minimal executions per cell, in this process (the scripted model:"
        " query, plan, report); each index twice, alternating; rows per execution, as"
        " `pg_stat_user_tables` counts them (rows a sequential scan read, rows an index scan"
        " fetched, a filter's rejects included).",
        "- Before 0030, every fenced write's check of its generation (`task_id`, `generation`,"
        " `outcome IS NULL`) read the open executions through the lease index: the whole queue,"
        " about a dozen times per execution. With 0030 it reads its row by the primary key.",
        "- The task row's status (`queued` at the claim, `running` in each fence) is checked on"
        " the row its key found (`store/row_checks.py`): before, under these statistics, the"
        " claim read every queued task through a status index and each fenced write every running"
        " one (`tests/integration/test_fence_with_a_backlog.py`: 3,921 task rows for one round"
        " with 1,500 queued and 300 running, under 100 now); both columns here have it.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
