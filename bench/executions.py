"""Executions beside raw Celery: dispatch latency, throughput, SIGKILL recovery, sweep cost.

    .venv/bin/python bench/executions.py [--samples N] [--executions N] [--recoveries N]
                                         [--running N] [--expired N] [--write]

Starts a throwaway Postgres and redis-server from the local binaries (the tests' helpers), real
`orchestrator worker` / `orchestrator sweeper` processes, and a raw Celery worker defined in this
file on the same broker, with the same worker settings as the orchestrator's app (acks late,
prefetch 1), and a Procrastinate worker (bench/procrastinate_baseline.py) on the same Postgres.
Every worker is one process running two jobs at once (see execution_fleet.POOL). The agent is
the scripted model: publish a plan, save a report. Each comparison is measured side by side in
the same run:

1. trigger -> agent start (the execution row's `started_at`, written by the worker when it claims
   the generation) beside raw Celery publish -> task start; samples interleaved one at a time.
2. minimal executions per second, beside raw Celery tasks and Procrastinate jobs that make as
   many Postgres commits as one execution does in its worker, and raw Celery tasks that send
   the execution's round trips with the raw drivers; bursts alternate, each kind twice.
3. recovery after SIGKILL (lease 3 s, sweep 1 s): kill -> next generation's `started_at`, with a
   second worker already running and an `orchestrator sweeper` process.
4. one sweep over N running executions of which M expired (rows inserted in bulk), beside probing
   every lease one by one.

`--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import execution_sweep
import execution_throughput
from docs_section import DOC, write_section
from execution_fleet import (
    CONCURRENCY,
    LEASE,
    MINIMAL,
    RAW_QUEUE,
    RAW_START,
    RAW_STARTS_KEY,
    RENEW,
    REPORT_ONLY,
    ROOT,
    SLOW,
    SWEEP,
    Proc,
    Processes,
    Series,
    minimal_turns,
    raw_celery,
    report_only_turns,
    servers,
    slow_turns,
)
from execution_report import report, sweep_section
from procrastinate_baseline import prepare as prepare_procrastinate

# After execution_fleet, which puts the project root on the path.
from tests.executions_support import wait_for

# --------------------------------------------------------------------------- the bench


@dataclass
class Bench:
    pg_url: str
    pg_dsn: str
    redis_url: str
    scripts: Path
    folder: Path
    procs: Processes
    rt: Any = None
    raw: Any = None
    pg: Any = None
    redis: Any = None
    figures: dict[str, Any] = field(default_factory=dict)
    compare_single: bool = False  # --sweep-only: also requeue the expiries one at a time

    def open(self) -> None:
        import psycopg
        import redis

        from orchestrator.runtime import build_runtime
        from tests.executions_support import settings_for
        from workers.celery_app import CeleryDispatcher, make_celery

        settings = settings_for(
            self.pg_url,
            self.scripts,
            redis_url=self.redis_url,
            lease_seconds=LEASE,
            lease_renew_seconds=RENEW,
            sweep_seconds=SWEEP,
            queued_stale_seconds=60,
            home=self.folder / "home",
        )
        self.rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
        self.raw = raw_celery(self.redis_url)
        self.pg = psycopg.connect(self.pg_dsn, autocommit=True)
        self.pg.execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, at timestamptz)"
        )
        self.redis = redis.Redis.from_url(self.redis_url)

    def close(self) -> None:
        for closer in (getattr(self.rt, "close", None), getattr(self.pg, "close", None)):
            if closer is not None:
                closer()
        if self.redis is not None:
            self.redis.close()

    # ------------------------------------------------------------------ helpers

    def trigger(self, task_type: str, title: str) -> str:
        from orchestrator.services.tasks import Trigger

        return str(self.rt.tasks.trigger(Trigger(task_type=task_type, title=title)).task.task_id)

    def status(self, task_id: str) -> str:
        row = self.pg.execute("SELECT status FROM tasks WHERE task_id = %s", (task_id,)).fetchone()
        return str(row[0]) if row else ""

    def started_at(self, task_id: str, generation: int) -> datetime | None:
        row = self.pg.execute(
            "SELECT started_at FROM executions WHERE task_id = %s AND generation = %s",
            (task_id, generation),
        ).fetchone()
        return row[0] if row else None

    def raw_start_sample(self) -> float:
        """Raw Celery publish -> task start, milliseconds."""
        sent = time.time()
        self.raw.send_task(RAW_START, queue=RAW_QUEUE)
        popped = self.redis.blpop([RAW_STARTS_KEY], timeout=30)
        if popped is None:
            raise RuntimeError("the raw Celery task did not start within 30 s")
        return (float(popped[1]) - sent) * 1000

    def orchestrator_start_sample(self) -> tuple[float, float]:
        """Trigger -> agent start and publish -> agent start, milliseconds; waits for the end."""
        published: list[float] = []
        dispatcher = self.rt.dispatcher
        original = dispatcher.dispatch

        def dispatch(task_id: str, generation: int, *, again: bool = False) -> None:
            published.append(time.time())
            original(task_id, generation, again=again)

        dispatcher.dispatch = dispatch
        try:
            sent = time.time()
            task_id = self.trigger(MINIMAL, "latency")
        finally:
            dispatcher.dispatch = original
        time.sleep(0.015)  # no polling queries while the worker starts the round
        wait_for(
            lambda: self.status(task_id) == "completed",
            30,
            what="a minimal round to complete",
            interval=0.005,
        )
        started = self.started_at(task_id, 1)
        assert started is not None
        at = started.timestamp()
        return (at - sent) * 1000, (at - published[0]) * 1000

    # ------------------------------------------------------------------ 1. latency

    def latency(self, samples: int) -> None:
        print(f"[1/4] trigger -> agent start, {samples} interleaved samples each", flush=True)
        ours, ours_pub, raw = Series("trigger"), Series("publish"), Series("raw")
        commit = Series("trigger's transaction")
        insert = Series("plain autocommit insert")
        for _ in range(max(10, samples // 10)):  # warm-up: pool processes, connections, caches
            self.raw_start_sample()
            self.orchestrator_start_sample()
            time.sleep(0.01)
        for _ in range(samples):
            raw.samples.append(self.raw_start_sample())
            time.sleep(0.01)
            total, from_publish = self.orchestrator_start_sample()
            ours.samples.append(total)
            ours_pub.samples.append(from_publish)
            commit.samples.append(total - from_publish)
            time.sleep(0.01)
            insert.samples.append(self.plain_insert_sample())
        self.figures["latency"] = {
            "raw": raw,
            "trigger": ours,
            "publish": ours_pub,
            "commit": commit,
            "insert": insert,
            "n": samples,
        }

    def plain_insert_sample(self) -> float:
        """One autocommit single-row INSERT on a kept psycopg connection, as sporadic as a
        trigger (the issue's reference commit), milliseconds."""
        started = time.perf_counter()
        self.pg.execute("INSERT INTO bench_raw (at) VALUES (now())")
        return (time.perf_counter() - started) * 1000

    # ------------------------------------------------------------------ 2. throughput

    def throughput(self, count: int, procrastinate_dsn: str, pg_server: Any, template: str) -> None:
        execution_throughput.measure(self, count, procrastinate_dsn, pg_server, template)

    # ------------------------------------------------------------------ 3. recovery

    def recovery(self, repetitions: int, workers: list[Proc]) -> None:
        print(f"[3/4] recovery after SIGKILL, {repetitions} kills", flush=True)
        sweeper = self.procs.sweeper()
        wait_for(
            lambda: "sweeping every" in sweeper.log.read_text(errors="replace"),
            30,
            what="sweeper",
            interval=0.005,
        )
        times: list[float] = []
        for rep in range(repetitions):
            task_id = self.trigger(SLOW, f"kill {rep}")
            wait_for(
                partial(self._has_plan, task_id),
                30,
                what="generation 1's first plan",
                interval=0.005,
            )
            holder = self._holder(task_id, workers)
            holder.kill()
            killed = time.time()
            workers.remove(holder)
            started = wait_for(
                partial(self.started_at, task_id, 2),
                30,
                what="generation 2 to start",
                interval=0.005,
            )
            times.append(started.timestamp() - killed)
            self.rt.tasks.cancel(task_id, "benchmark: recovery measured")
            replacement = self.procs.worker(CONCURRENCY)
            workers.append(replacement)
            wait_for(replacement.ready, 60, what="a replacement worker", interval=0.1)
        sweeper.stop()
        self.figures["recovery"] = {"seconds": times}

    def _has_plan(self, task_id: str) -> bool:
        row = self.pg.execute(
            "SELECT 1 FROM plan_revisions p JOIN tasks t ON t.session_id = p.session_id "
            "WHERE t.task_id = %s",
            (task_id,),
        ).fetchone()
        return row is not None

    def _holder(self, task_id: str, workers: list[Proc]) -> Proc:
        row = self.pg.execute(
            "SELECT worker FROM executions WHERE task_id = %s AND generation = 1", (task_id,)
        ).fetchone()
        pid = int(str(row[0]).rsplit(":", 1)[1])
        group = os.getpgid(pid)
        for proc in workers:
            if proc.process.pid == group:
                return proc
        raise RuntimeError(f"no benchmark worker runs pid {pid}")

    # ------------------------------------------------------------------ 4. sweep

    def sweep(
        self, running: int, expired: int, repeats: int, pg_server: Any, template: str
    ) -> None:
        self.figures["sweep"] = execution_sweep.measure(
            self.rt.settings,
            self.redis,
            self.folder,
            running,
            expired,
            repeats,
            pg_server,
            template,
            self.compare_single,
        )


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="latency samples per side")
    parser.add_argument("--executions", type=int, default=200, help="throughput burst size")
    parser.add_argument("--recoveries", type=int, default=5, help="SIGKILLs to time")
    parser.add_argument("--running", type=int, default=10_000, help="running executions")
    parser.add_argument("--expired", type=int, default=100, help="of which expired")
    parser.add_argument("--sweeps", type=int, default=5, help="timed sweeps with expiries")
    parser.add_argument(
        "--durable", action="store_true", help="Postgres with fsync and synchronous commit on"
    )
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument(
        "--sweep-only", action="store_true", help="only the sweep section, printed (no --write)"
    )
    args = parser.parse_args()
    command = (
        f".venv/bin/python bench/executions.py --samples {args.samples} --executions "
        f"{args.executions} --recoveries {args.recoveries} --running {args.running} --expired "
        f"{args.expired} --sweeps {args.sweeps}{' --durable' if args.durable else ''} --write"
    )
    begun = time.monotonic()
    load_start = os.getloadavg()[0]
    from tests.executions_support import write_script

    folder = Path(tempfile.mkdtemp(prefix="orch-bench-exec-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        pg_server, pg_url, redis_url, template = stack.enter_context(servers(args.durable))
        procrastinate_dsn = prepare_procrastinate(pg_server)
        scripts = folder / "scripts"
        write_script(scripts, MINIMAL, minimal_turns())
        write_script(scripts, SLOW, slow_turns(8.0))
        write_script(scripts, REPORT_ONLY, report_only_turns())
        env = {
            "ORCH_DATABASE_URL": pg_url,
            "ORCH_REDIS_URL": redis_url,
            "ORCH_MODEL": f"scripted:{scripts}",
            "ORCH_LEASE_SECONDS": str(LEASE),
            "ORCH_LEASE_RENEW_SECONDS": str(RENEW),
            "ORCH_SWEEP_SECONDS": str(SWEEP),
            "ORCH_QUEUED_STALE_SECONDS": "60",
            "ORCH_HOME": str(folder / "home"),
            "BENCH_REDIS_URL": redis_url,
            "BENCH_PG_DSN": pg_url.replace("+psycopg", ""),
            "BENCH_PROCRASTINATE_DSN": procrastinate_dsn,
        }
        procs = Processes(folder, env)
        stack.callback(procs.stop_all)
        bench = Bench(pg_url, env["BENCH_PG_DSN"], redis_url, scripts, folder, procs)
        stack.callback(bench.close)
        bench.open()
        if args.sweep_only:
            bench.compare_single = True
            bench.sweep(args.running, args.expired, args.sweeps, pg_server, template)
            section = sweep_section(bench.figures["sweep"], args, load_start)
            print(section)
            print("\n".join(bench.figures["sweep"]["profile"].splitlines()[:30]))
            if args.write:
                write_section("sweeps", section)
            return 0
        worker = procs.worker(CONCURRENCY)
        raw_worker = procs.raw_worker(CONCURRENCY)
        procrastinate_worker = procs.procrastinate_worker(CONCURRENCY)
        for proc in (worker, raw_worker, procrastinate_worker):
            wait_for(proc.ready, 60, what=f"{proc.name} to be ready", interval=0.1)
        try:
            bench.latency(args.samples)
            bench.throughput(args.executions, procrastinate_dsn, pg_server, template)
            raw_worker.stop()
            procrastinate_worker.stop()
            spare = procs.worker(CONCURRENCY)
            wait_for(spare.ready, 60, what="a second worker", interval=0.1)
            bench.recovery(args.recoveries, [worker, spare])
            procs.stop_all()
            bench.sweep(args.running, args.expired, args.sweeps, pg_server, template)
        except Exception:
            for log in sorted(folder.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        import celery
        import kombu
        import procrastinate

        versions = (
            f"Celery {celery.__version__}, Kombu {kombu.__version__}, Procrastinate "
            f"{procrastinate.__version__}, Postgres {pg_server.version}"
        )
        bench.figures["load"] = (load_start, os.getloadavg()[0])
        section = report(bench.figures, command, versions, args.durable)
        print(section)
        thr, sw = bench.figures["throughput"], bench.figures["sweep"]
        print("--- CPU profile of 20 in-process minimal executions (tottime, this thread)")
        print("\n".join(thr["profile"].splitlines()[:45]))
        print("--- profile of one sweep with requeues (tottime)")
        print("\n".join(sw["profile"].splitlines()[:35]))
        print(json.dumps({"elapsed_s": round(time.monotonic() - begun, 1)}))
    if args.write:
        write_section("executions-durable" if args.durable else "executions", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
