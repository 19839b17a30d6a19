"""Executions beside raw Celery: dispatch latency, throughput, SIGKILL recovery, sweep cost.

    .venv/bin/python bench/executions.py [--samples N] [--executions N] [--recoveries N]
                                         [--running N] [--expired N] [--write]

Starts a throwaway Postgres and redis-server from the local binaries (the tests' helpers), real
`orchestrator worker` / `orchestrator sweeper` processes, and a raw Celery worker defined in this
file on the same broker, with the same worker settings as the orchestrator's app (acks late,
prefetch 1, prefork pool, two processes). The agent is the scripted model: publish a plan, save a
report. Each comparison is measured side by side in the same run:

1. trigger -> agent start (the execution row's `started_at`, written by the worker when it claims
   the generation) beside raw Celery publish -> task start; samples interleaved one at a time.
2. minimal executions per second with one worker of two processes, beside raw Celery tasks that
   make as many Postgres commits as one execution does in its worker.
3. recovery after SIGKILL (lease 3 s, sweep 1 s): kill -> next generation's `started_at`, with a
   second worker already running and an `orchestrator sweeper` process.
4. one sweep over N running executions of which M expired (rows inserted in bulk), beside probing
   every lease one by one.

`--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:executions -->", "<!-- /bench:executions -->"
RAW_QUEUE = "bench-raw"
RAW_START, RAW_COMMITS = "bench.raw.start", "bench.raw.commits"
RAW_STARTS_KEY, RAW_DONE_KEY = "bench:raw:starts", "bench:raw:done"
LEASE, RENEW, SWEEP = 3.0, 1.0, 1.0
MINIMAL, SLOW = "minimal", "slow"


# --------------------------------------------------------------------------- statistics


@dataclass
class Series:
    label: str
    samples: list[float] = field(default_factory=list)  # milliseconds

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile, as bench/leases.py reads it."""
        ordered = sorted(self.samples)
        index = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
        return ordered[index]

    @property
    def p50(self) -> float:
        return self.quantile(0.50)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)


# --------------------------------------------------------------------------- raw Celery


def raw_celery(redis_url: str) -> Any:
    """Plain Celery on the same broker, with the worker settings of workers/celery_app.py."""
    from celery import Celery

    from workers.celery_app import VISIBILITY_TIMEOUT_SECONDS

    app = Celery("bench-raw")
    app.conf.update(
        broker_url=redis_url,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS},
        task_default_queue=RAW_QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    state: dict[str, Any] = {}

    def redis_client() -> Any:
        import redis

        if state.get("pid") != os.getpid():  # one client and one connection per pool process
            state.clear()
            state["pid"] = os.getpid()
            state["redis"] = redis.Redis.from_url(redis_url)
        return state["redis"]

    @app.task(name=RAW_START)  # type: ignore[untyped-decorator]
    def start() -> None:
        redis_client().rpush(RAW_STARTS_KEY, repr(time.time()))

    @app.task(name=RAW_COMMITS)  # type: ignore[untyped-decorator]
    def commits(count: int) -> None:
        import psycopg

        client = redis_client()
        if "pg" not in state:
            state["pg"] = psycopg.connect(os.environ["BENCH_PG_DSN"], autocommit=True)
        pg = state["pg"]
        for _ in range(count):
            # One transaction per commit, as the service's `db.transaction()` blocks are.
            with pg.transaction():
                pg.execute("INSERT INTO bench_raw (at) VALUES (now())")
        client.rpush(RAW_DONE_KEY, repr(time.time()))

    return app


def raw_worker_main(concurrency: int) -> None:
    app = raw_celery(os.environ["BENCH_REDIS_URL"])
    app.worker_main(
        [
            "worker",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--concurrency",
            str(concurrency),
            "-Q",
            RAW_QUEUE,
            "-n",
            f"raw-{os.getpid()}@%h",
        ]
    )


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def ready(self) -> bool:
        return self.log.exists() and " ready." in self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group, pool children included, as a dead machine."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill()


class Processes:
    """The benchmark's own child processes; every one is stopped at the end."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.started: list[Proc] = []

    def start(self, name: str, argv: list[str]) -> Proc:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        merged.update(self.env)
        log = self.folder / f"{name}-{len(self.started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                env=merged,
                cwd=self.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group
            )
        proc = Proc(name, process, log)
        self.started.append(proc)
        return proc

    def worker(self, concurrency: int = 2) -> Proc:
        orchestrator = str(Path(sys.executable).with_name("orchestrator"))
        argv = [orchestrator, "worker", "--concurrency", str(concurrency), "--loglevel", "INFO"]
        return self.start("worker", argv)

    def sweeper(self) -> Proc:
        return self.start(
            "sweeper", [str(Path(sys.executable).with_name("orchestrator")), "sweeper"]
        )

    def raw_worker(self, concurrency: int = 2) -> Proc:
        argv = [sys.executable, str(Path(__file__).resolve()), "--raw-worker", str(concurrency)]
        return self.start("raw-worker", argv)

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.005
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- scripts


def minimal_turns() -> list[dict[str, Any]]:
    """The minimal round: publish a plan (one completed node), save a report, answer."""
    from tests.executions_support import node, plan_call, report_call

    return [
        {"tool_calls": [plan_call("c1", "r1", [node("a", "completed")])]},
        {"tool_calls": [report_call("c2", "completed")]},
        {"content": "done"},
    ]


def slow_turns(delay_s: float) -> list[dict[str, Any]]:
    """A round that publishes a plan, then thinks for `delay_s` (the window for a SIGKILL)."""
    from tests.executions_support import node, plan_call, report_call

    return [
        {"tool_calls": [plan_call("c1", "r1", [node("a", "running")])]},
        {"delay_s": delay_s, "tool_calls": [plan_call("c2", "r2", [node("a", "completed")])]},
        {"tool_calls": [report_call("c3", "completed")]},
        {"content": "done"},
    ]


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

        def dispatch(task_id: str, generation: int) -> None:
            published.append(time.time())
            original(task_id, generation)

        dispatcher.dispatch = dispatch
        try:
            sent = time.time()
            task_id = self.trigger(MINIMAL, "latency")
        finally:
            dispatcher.dispatch = original
        time.sleep(0.015)  # no polling queries while the worker starts the round
        wait_for(lambda: self.status(task_id) == "completed", 30, "a minimal round to complete")
        started = self.started_at(task_id, 1)
        assert started is not None
        at = started.timestamp()
        return (at - sent) * 1000, (at - published[0]) * 1000

    # ------------------------------------------------------------------ 1. latency

    def latency(self, samples: int) -> None:
        print(f"[1/4] trigger -> agent start, {samples} interleaved samples each", flush=True)
        ours, ours_pub, raw = Series("trigger"), Series("publish"), Series("raw")
        commit = Series("trigger's transaction")
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
        self.figures["latency"] = {
            "raw": raw,
            "trigger": ours,
            "publish": ours_pub,
            "commit": commit,
            "n": samples,
        }

    # ------------------------------------------------------------------ 2. throughput

    def commits_per_execution(self) -> dict[str, Any]:
        """Transactions and Redis calls of one minimal execution, counted in process."""
        import redis
        from sqlalchemy import event

        from orchestrator.agent.host import ToolHost
        from orchestrator.services.dispatch import RecordingDispatcher
        from orchestrator.services.tasks import Trigger

        rt = self.rt
        saved = rt.dispatcher
        rt.dispatcher = RecordingDispatcher()
        rt.__dict__.pop("tasks", None)
        rt.__dict__.pop("executions", None)
        counts = {"commit": 0, "statement": 0, "checkout": 0, "redis": 0}

        def on_commit(_conn: Any) -> None:
            counts["commit"] += 1

        def on_statement(*_args: Any) -> None:
            counts["statement"] += 1

        def on_checkout(*_args: Any) -> None:
            counts["checkout"] += 1  # each checkout is pre-pinged: one more round trip

        original_execute = redis.Redis.execute_command

        def counting_execute(client: Any, *args: Any, **options: Any) -> Any:
            counts["redis"] += 1
            return original_execute(client, *args, **options)  # type: ignore[no-untyped-call]

        hooks = [
            (rt.db.engine, "commit", on_commit),
            (rt.db.engine, "before_cursor_execute", on_statement),
            (rt.db.engine.pool, "checkout", on_checkout),
        ]
        try:
            run_times: list[float] = []
            for index in range(31):
                task_id = rt.tasks.trigger(Trigger(task_type=MINIMAL, title="count")).task.task_id
                if index == 0:
                    for target, name, hook in hooks:
                        event.listen(target, name, hook)
                    setattr(redis.Redis, "execute_command", counting_execute)  # noqa: B010
                started = time.perf_counter()
                try:
                    result = rt.executions.run(task_id, 1, worker="bench:inprocess")
                finally:
                    if index == 0:
                        setattr(redis.Redis, "execute_command", original_execute)  # noqa: B010
                        for target, name, hook in hooks:
                            event.remove(target, name, hook)
                run_times.append((time.perf_counter() - started) * 1000)
                if result.outcome != "completed":
                    raise RuntimeError(f"the minimal round ended {result.outcome}: {result.detail}")
            schema_ms = Series("schemas")
            host = ToolHost(rt.executions._tools(None), ledger=None)
            for _ in range(30):
                started = time.perf_counter()
                host.schemas()
                schema_ms.samples.append((time.perf_counter() - started) * 1000)
            profiler = cProfile.Profile()
            for _ in range(20):
                task_id = rt.tasks.trigger(Trigger(task_type=MINIMAL, title="profile")).task.task_id
                profiler.enable()
                rt.executions.run(task_id, 1, worker="bench:inprocess")
                profiler.disable()
        finally:
            rt.dispatcher = saved
            rt.__dict__.pop("tasks", None)
            rt.__dict__.pop("executions", None)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        (self.folder / "profile-execution.txt").write_text(text.getvalue())
        return {
            "by_library": by_library(profiler),
            "commits": counts["commit"],
            "statements": counts["statement"],
            "checkouts": counts["checkout"],
            "redis_calls": counts["redis"],
            "schema_ms": schema_ms,
            "inprocess_ms": Series("inprocess", run_times[1:]),
            "profile": text.getvalue(),
        }

    def throughput(self, count: int) -> None:
        print(f"[2/4] throughput, {count} minimal executions vs {count} raw tasks", flush=True)
        from orchestrator.services.dispatch import RecordingDispatcher
        from orchestrator.services.tasks import Trigger

        counted = self.commits_per_execution()
        commits = counted["commits"]
        # Create the tasks first (their trigger commits are not the worker's work), then time
        # the wake-ups from the first publish to the last end, as for the raw tasks.
        rt = self.rt
        saved = rt.dispatcher
        rt.dispatcher = RecordingDispatcher()
        rt.__dict__.pop("tasks", None)
        try:
            task_ids = [
                rt.tasks.trigger(Trigger(task_type=MINIMAL, title=f"t{n}")).task.task_id
                for n in range(count)
            ]
        finally:
            rt.dispatcher = saved
            rt.__dict__.pop("tasks", None)
        self.redis.delete(RAW_DONE_KEY)
        raw_s = self._raw_burst(count, commits)
        ours_s = self._orchestrator_burst(task_ids)
        raw_s2 = self._raw_burst(count, commits)  # before and after: load drift shows up here
        self.figures["throughput"] = {
            "n": count,
            "commits": commits,
            "redis_calls": counted["redis_calls"],
            "by_library": counted["by_library"],
            "statements": counted["statements"],
            "checkouts": counted["checkouts"],
            "schema_ms": counted["schema_ms"],
            "inprocess": counted["inprocess_ms"],
            "ours_s": ours_s,
            "raw_s": [raw_s, raw_s2],
            "profile": counted["profile"],
        }

    def _raw_burst(self, count: int, commits: int) -> float:
        self.redis.delete(RAW_DONE_KEY)
        first = time.time()
        for _ in range(count):
            self.raw.send_task(RAW_COMMITS, args=[commits], queue=RAW_QUEUE)
        ends = []
        for _ in range(count):
            popped = self.redis.blpop([RAW_DONE_KEY], timeout=60)
            if popped is None:
                raise RuntimeError("raw Celery tasks did not finish within 60 s")
            ends.append(float(popped[1]))
        return max(ends) - first

    def _orchestrator_burst(self, task_ids: list[str]) -> float:
        first = time.time()
        for task_id in task_ids:
            self.rt.dispatcher.dispatch(task_id, 1)

        def all_done() -> bool:
            row = self.pg.execute(
                "SELECT count(*) FROM tasks WHERE task_id = ANY(%s) AND status = 'completed'",
                (task_ids,),
            ).fetchone()
            return bool(row and row[0] == len(task_ids))

        wait_for(all_done, 120, "the burst of minimal rounds", interval=0.02)
        row = self.pg.execute(
            "SELECT max(ended_at) FROM executions WHERE task_id = ANY(%s)", (task_ids,)
        ).fetchone()
        return float(row[0].timestamp() - first)

    # ------------------------------------------------------------------ 3. recovery

    def recovery(self, repetitions: int, workers: list[Proc]) -> None:
        print(f"[3/4] recovery after SIGKILL, {repetitions} kills", flush=True)
        sweeper = self.procs.sweeper()
        wait_for(lambda: "sweeping every" in sweeper.log.read_text(errors="replace"), 30, "sweeper")
        times: list[float] = []
        for rep in range(repetitions):
            task_id = self.trigger(SLOW, f"kill {rep}")
            wait_for(partial(self._has_plan, task_id), 30, "generation 1's first plan")
            holder = self._holder(task_id, workers)
            holder.kill()
            killed = time.time()
            workers.remove(holder)
            started = wait_for(partial(self.started_at, task_id, 2), 30, "generation 2 to start")
            times.append(started.timestamp() - killed)
            self.rt.tasks.cancel(task_id, "benchmark: recovery measured")
            replacement = self.procs.worker(2)
            workers.append(replacement)
            wait_for(replacement.ready, 60, "a replacement worker", interval=0.1)
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
        print(f"[4/4] one sweep over {running} running executions, {expired} expired", flush=True)
        import psycopg
        from sqlalchemy import insert, select

        from orchestrator.leases.keys import lease_key
        from orchestrator.runtime import build_runtime
        from orchestrator.services.lease_keeper import lease_name
        from orchestrator.store import tasks as task_store
        from orchestrator.store.tables import executions, sessions, tasks
        from orchestrator.store.types import utcnow
        from workers.celery_app import CeleryDispatcher, make_celery

        name = pg_server.create_database(template=template)
        url = pg_server.url(name)
        settings = self.rt.settings.model_copy(update={"database_url": url})
        rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
        bulk_pg = psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
        live: list[str] = []

        def add_running(count: int) -> None:
            """`count` running generation-1 executions with live leases, inserted in bulk."""
            now = utcnow()
            task_rows: list[dict[str, Any]] = []
            session_rows: list[dict[str, Any]] = []
            execution_rows: list[dict[str, Any]] = []
            pipe = self.redis.pipeline(transaction=False)
            stamp = int(time.time() * 1000)
            for _ in range(count):
                task_id, session_id, token = (str(uuid.uuid4()) for _ in range(3))
                live.append(task_id)
                task_rows.append(
                    {
                        "task_id": task_id,
                        "task_type": MINIMAL,
                        "title": "bulk",
                        "context": {},
                        "sample_input": None,
                        "trigger_id": f"bulk:{task_id}",
                        "origin": "live",
                        "status": "running",
                        "generation": 1,
                        "session_id": session_id,
                        "recoveries": 0,
                        "rounds": 0,
                        "queued_at": now,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                session_rows.append(
                    {
                        "session_id": session_id,
                        "purpose": "task_execution",
                        "task_id": task_id,
                        "generation": 1,
                        "owner": f"task:{task_id}",
                        "title": "bulk (generation 1)",
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                execution_rows.append(
                    {
                        "task_id": task_id,
                        "generation": 1,
                        "session_id": session_id,
                        "worker": "bench:bulk",
                        "lease_token": token,
                        "lease_expires_at": now + timedelta(hours=1),
                        "created_at": now,
                        "started_at": now,
                    }
                )
                pipe.set(
                    lease_key(lease_name(task_id)),
                    f"{token}|{stamp}|{stamp}|bench:bulk",
                    px=3_600_000,
                )
            with rt.db.transaction() as conn:
                conn.execute(insert(tasks), task_rows)
                conn.execute(insert(sessions), session_rows)
                conn.execute(insert(executions), execution_rows)
            pipe.execute()

        def expire(count: int) -> list[str]:
            """The leases of `count` running executions ran out: mirror in the past, key gone."""
            batch = [live.pop(0) for _ in range(count)]
            bulk_pg.execute(
                "UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                "WHERE task_id = ANY(%s) AND generation = 1",
                (batch,),
            )
            self.redis.delete(*[lease_key(lease_name(t)) for t in batch])
            return batch

        def lookup() -> int:
            with rt.db.transaction(readonly=True) as conn:
                return len(task_store.expired_executions(conn, utcnow(), rt.sweeper.batch))

        def running_rows() -> list[Any]:
            with rt.db.transaction(readonly=True) as conn:
                return list(
                    conn.execute(
                        select(executions.c.task_id, executions.c.lease_token).where(
                            executions.c.outcome.is_(None), executions.c.started_at.is_not(None)
                        )
                    )
                )

        try:
            add_running(running)
            bulk_pg.execute("ANALYZE")
            empty, find, full, per = Series("empty"), Series("lookup"), Series("full"), []
            for _ in range(5):  # warm-up: connections, statement caches
                rt.sweeper.sweep()
                lookup()
            for _ in range(repeats * 3):
                t0 = time.perf_counter()
                swept = rt.sweeper.sweep()
                empty.samples.append((time.perf_counter() - t0) * 1000)
                assert not swept.requeued
            profile_text = ""
            for rep in range(repeats + 1):
                batch = expire(expired)
                t0 = time.perf_counter()
                found = lookup()
                find.samples.append((time.perf_counter() - t0) * 1000)
                if found != len(batch):
                    raise RuntimeError(f"the lookup found {found} of {len(batch)} expiries")
                profiler = cProfile.Profile() if rep == repeats else None
                t0 = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                swept = rt.sweeper.sweep()
                if profiler is not None:
                    profiler.disable()
                elapsed = (time.perf_counter() - t0) * 1000
                if profiler is None:
                    full.samples.append(elapsed)
                    per.append(elapsed / max(1, len(swept.requeued)))
                else:  # the last round only profiles (the profiler's overhead is not timed)
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
                    profile_text = text.getvalue()
                    (self.folder / "profile-sweep.txt").write_text(profile_text)
                if len(swept.requeued) != len(batch):
                    raise RuntimeError(f"the sweep requeued {len(swept.requeued)} of {len(batch)}")
                add_running(expired)  # back to `running` running executions
            # The naive contrast: every running execution's lease probed, one call each.
            expire(expired)
            running_rows()
            t0 = time.perf_counter()
            rows = running_rows()
            missing = 0
            for row in rows:
                info = rt.leases.get(lease_name(row.task_id))
                if info is None or info.token != row.lease_token:
                    missing += 1
            naive_ms = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            rows = running_rows()
            pipe = self.redis.pipeline(transaction=False)
            for row in rows:
                pipe.get(lease_key(lease_name(row.task_id)))
            missing_pipelined = sum(1 for value in pipe.execute() if value is None)
            pipelined_ms = (time.perf_counter() - t0) * 1000
        finally:
            bulk_pg.close()
            rt.close()
        self.figures["sweep"] = {
            "running": running,
            "expired": expired,
            "repeats": repeats,
            "empty": empty,
            "lookup": find,
            "full": full,
            "per_requeue": statistics.median(per) if per else float("nan"),
            "naive_ms": naive_ms,
            "naive_rows": len(rows),
            "naive_missing": missing,
            "pipelined_ms": pipelined_ms,
            "pipelined_missing": missing_pipelined,
            "profile": profile_text,
        }


# --------------------------------------------------------------------------- report

_WAITS = {"recv", "recv_into", "send", "sendall", "poll", "select", "wait", "wait_c", "acquire"}


def by_library(profiler: cProfile.Profile) -> list[tuple[str, float]]:
    """Share of own (tottime) profile time per library; socket and lock waits on their own."""
    totals: dict[str, float] = {}
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        if path == "~":
            quoted = re.search(r"'([^']+)'", func)  # "<method 'recv' of '_socket.socket' ...>"
            name = (quoted.group(1) if quoted else func.strip("<>{}").split()[-1]).rsplit(".")[-1]
            group = "waiting on sockets and locks" if name in _WAITS else "builtins"
        elif "site-packages/" in path:
            group = path.split("site-packages/", 1)[1].split("/", 1)[0]
        elif "/orchestrator/" in path:
            group = "orchestrator"
        else:
            group = "stdlib and other"
        totals[group] = totals.get(group, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    return sorted(((k, v / whole) for k, v in totals.items()), key=lambda kv: -kv[1])


def goal(met: bool) -> str:
    return "met" if met else "**NOT met**"


def report(figures: dict[str, Any], command: str, versions: str) -> str:
    lat = figures["latency"]
    raw, ours, pub, commit = lat["raw"], lat["trigger"], lat["publish"], lat["commit"]
    thr = figures["throughput"]
    raw_rate = thr["n"] / statistics.fmean(thr["raw_s"])
    ours_rate = thr["n"] / thr["ours_s"]
    rec = figures["recovery"]["seconds"]
    sw = figures["sweep"]
    load = figures["load"]
    pg_trips = thr["statements"] + thr["checkouts"] + 2 * thr["commits"]
    lines = [
        "## Executions",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with other work (load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end), Python {platform.python_version()}, {versions}. Loopback "
        "Postgres (fsync off, as in the tests) and redis-server started by the benchmark; real "
        "`orchestrator worker --concurrency 2` processes; the raw Celery app is defined in the "
        "benchmark with the orchestrator's worker settings (acks late, reject on worker lost, "
        "prefetch 1, prefork, 2 processes) on the same broker. The agent is the scripted model "
        "publishing one plan and saving one report. Command (one to two minutes):",
        "",
        "```sh",
        command,
        "```",
        "",
        "| measure | orchestrator | raw Celery, same run | ratio | goal | |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        f"| trigger -> agent start, p50 ms ({lat['n']} sequential each) | {ours.p50:.2f} | "
        f"{raw.p50:.2f} | +{ours.p50 - raw.p50:.2f} ms | <= raw + 2 ms | "
        f"{goal(ours.p50 <= raw.p50 + 2)} |",
        f"| trigger -> agent start, p99 ms | {ours.p99:.2f} | {raw.p99:.2f} | "
        f"{ours.p99 / raw.p99:.2f}x | <= 2x raw | {goal(ours.p99 <= 2 * raw.p99)} |",
        f"| publish -> agent start, p50 ms (the trigger's transaction left out) | {pub.p50:.2f} | "
        f"{raw.p50:.2f} | +{pub.p50 - raw.p50:.2f} ms | <= raw + 2 ms | "
        f"{goal(pub.p50 <= raw.p50 + 2)} |",
        f"| publish -> agent start, p99 ms | {pub.p99:.2f} | {raw.p99:.2f} | "
        f"{pub.p99 / raw.p99:.2f}x | <= 2x raw | {goal(pub.p99 <= 2 * raw.p99)} |",
        f"| minimal executions/s, 1 worker x 2 processes ({thr['n']} each) | {ours_rate:.1f} | "
        f"{raw_rate:.1f} | {ours_rate / raw_rate:.2f}x | >= 0.6x | "
        f"{goal(ours_rate >= 0.6 * raw_rate)} |",
        f"| recovery after SIGKILL (lease {LEASE:g} s, sweep {SWEEP:g} s), worst of {len(rec)}, s "
        f"| {max(rec):.2f} | not measured (issue: ~90) | | <= 5 s | {goal(max(rec) <= 5)} |",
        f"| sweep lookup, {sw['running']:,} running / {sw['expired']} expired, p50 ms | "
        f"{sw['lookup'].p50:.2f} | probe every lease: {sw['naive_ms']:.0f} | "
        f"{sw['naive_ms'] / sw['lookup'].p50:.0f}x faster | <= 10 ms | "
        f"{goal(sw['lookup'].p50 <= 10)} |",
        f"| whole sweep, {sw['running']:,} running / none expired, p50 ms | "
        f"{sw['empty'].p50:.2f} | | | <= 10 ms | {goal(sw['empty'].p50 <= 10)} |",
        f"| whole sweep including the {sw['expired']} requeues, p50 ms | {sw['full'].p50:.1f} | "
        f"| | <= 10 ms if read as the whole sweep | {goal(sw['full'].p50 <= 10)} |",
        "",
        "How each figure is taken:",
        "",
        f"- Latency: raw and orchestrator samples alternate one at a time, each on idle workers. "
        "Agent start is the execution row's `started_at`, written in the claim transaction after "
        "the lease was taken (same machine, same wall clock on both sides). p50/p99/mean ms: "
        f"trigger -> start {ours.p50:.2f}/{ours.p99:.2f}/{ours.mean:.2f}; publish -> start "
        f"{pub.p50:.2f}/{pub.p99:.2f}/{pub.mean:.2f}; raw {raw.p50:.2f}/{raw.p99:.2f}/"
        f"{raw.mean:.2f}; the trigger's own transaction (task, session and execution rows) "
        f"{commit.p50:.2f}/{commit.p99:.2f}/{commit.mean:.2f}.",
        f"- Throughput: the tasks are created first, then timed from the first wake-up publish to "
        f"the last `ended_at` ({thr['ours_s']:.2f} s). One minimal execution makes "
        f"{thr['commits']} Postgres transactions in the worker (counted with engine events), so "
        f"each raw task makes {thr['commits']} single-INSERT transactions on a kept psycopg "
        "connection; raw bursts before and after the orchestrator's: "
        f"{', '.join(f'{s:.2f}' for s in thr['raw_s'])} s (their mean is the baseline).",
        f"- Recovery: kill -> generation 2 `started_at`, {len(rec)} kills: "
        f"{', '.join(f'{s:.2f}' for s in rec)} s. The killed worker held generation 1 mid-round "
        "(just after its first plan write, which renewed the lease); a second worker was idle; "
        f"one `orchestrator sweeper` process. Expected: the lease ({LEASE:g} s) plus up to one "
        f"sweep interval ({SWEEP:g} s).",
        f"- Sweep: {sw['running']:,} running executions with live Redis leases, rows inserted in "
        f"bulk; before each of {sw['repeats']} timed sweeps {sw['expired']} of them expire "
        "(mirrored expiry in the past, Redis key gone) and are topped up again afterwards. "
        "Lookup = the sweep's indexed query alone. The issue sets the 10 ms goal against "
        "probing every lease (its figures: about 1 ms for an indexed lookup, about 100 ms for "
        "the probe), so the lookup row is the one the goal is read against; the whole sweep "
        "with its requeues is shown so that their cost is not hidden. It costs "
        f"{sw['per_requeue']:.2f} ms per requeue (a lease read, one transaction that closes the "
        "generation and opens the next, one Celery publish), so it grows with the expiries, not "
        f"with the running tasks. Probing every lease one by one: {sw['naive_ms']:.0f} ms for "
        f"{sw['naive_rows']:,} leases; pipelined in one batch still {sw['pipelined_ms']:.0f} "
        "ms.",
        "",
        "What dominates (profiled in the same run; the profiles are printed by the command):",
        "",
        f"- One minimal execution in process, without Celery, takes {thr['inprocess'].p50:.1f} ms "
        f"(p50). It sends {thr['statements']} SQL statements in {thr['commits']} transactions; "
        f"with the pool's pre-ping on each of the {thr['checkouts']} checkouts and BEGIN/COMMIT "
        f"that is about {pg_trips} Postgres round trips, against {3 * thr['commits']} for the raw "
        f"task, plus {thr['redis_calls']} Redis commands (lease take, renewals on the plan and "
        "report writes, release, plan event). Own time by library under the profiler (which "
        "inflates pure-Python shares; psycopg's share includes its waits on the server): "
        + ", ".join(f"{name} {share:.0%}" for name, share in thr["by_library"][:7])
        + ". The tools' JSON schemas (cached per process) cost "
        f"{thr['schema_ms'].p50:.2f} ms p50. The Celery settings are the same on both sides, so "
        "they do not explain the gap.",
        "- Latency: after the publish the worker takes the lease (one Redis round trip), then "
        "claims the generation (the pool's pre-ping, then one transaction with two UPDATE ... "
        "RETURNING; `started_at` is taken before its first statement). Before the publish, the "
        "trigger is one statement sent in autocommit (task, session and execution rows in one "
        "INSERT ... WITH), after the pool's pre-ping. The goal budgets one lease round trip and "
        "one commit; the path has the lease round trip, the trigger's statement, the claim's "
        "BEGIN, and the two pre-pings that the pool settings ask for on every checkout, plus the "
        "Python of SQLAlchemy and the service on each side.",
        "- Sweep: the lookup is one index range scan on (outcome, lease_expires_at); a requeue is "
        "a lease read, a transaction of about 9 round trips and a Celery publish, one after "
        "another for each expiry.",
    ]
    return "\n".join(lines) + "\n"


def write_section(section: str) -> None:
    """Replace only this benchmark's marked section; other benchmarks' sections stay as they are."""
    block = f"{BEGIN}\n{section}{END}\n"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


# --------------------------------------------------------------------------- main


@contextmanager
def servers() -> Iterator[tuple[Any, str, str, str]]:
    from orchestrator.store.migrations import upgrade
    from tests.services import PostgresServer, RedisServer

    with ExitStack() as stack:
        redis_server = RedisServer()
        redis_server.start()
        stack.callback(redis_server.close)
        pg_server = PostgresServer()
        stack.callback(pg_server.stop)
        pg_server.start()
        template = pg_server.create_database()
        upgrade(pg_server.url(template))
        name = pg_server.create_database(template=template)
        yield pg_server, pg_server.url(name), redis_server.url, template


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="latency samples per side")
    parser.add_argument("--executions", type=int, default=200, help="throughput burst size")
    parser.add_argument("--recoveries", type=int, default=5, help="SIGKILLs to time")
    parser.add_argument("--running", type=int, default=10_000, help="running executions")
    parser.add_argument("--expired", type=int, default=100, help="of which expired")
    parser.add_argument("--sweeps", type=int, default=5, help="timed sweeps with expiries")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--raw-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_worker:
        raw_worker_main(args.raw_worker)
        return 0
    command = (
        f".venv/bin/python bench/executions.py --samples {args.samples} --executions "
        f"{args.executions} --recoveries {args.recoveries} --running {args.running} --expired "
        f"{args.expired} --sweeps {args.sweeps} --write"
    )
    begun = time.monotonic()
    load_start = os.getloadavg()[0]
    from tests.executions_support import write_script

    folder = Path(tempfile.mkdtemp(prefix="orch-bench-exec-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        pg_server, pg_url, redis_url, template = stack.enter_context(servers())
        scripts = folder / "scripts"
        write_script(scripts, MINIMAL, minimal_turns())
        write_script(scripts, SLOW, slow_turns(8.0))
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
        }
        procs = Processes(folder, env)
        stack.callback(procs.stop_all)
        bench = Bench(pg_url, env["BENCH_PG_DSN"], redis_url, scripts, folder, procs)
        stack.callback(bench.close)
        bench.open()
        worker = procs.worker(2)
        raw_worker = procs.raw_worker(2)
        for proc in (worker, raw_worker):
            wait_for(proc.ready, 60, f"{proc.name} to be ready", interval=0.1)
        try:
            bench.latency(args.samples)
            bench.throughput(args.executions)
            raw_worker.stop()
            spare = procs.worker(2)
            wait_for(spare.ready, 60, "a second worker", interval=0.1)
            bench.recovery(args.recoveries, [worker, spare])
            procs.stop_all()
            bench.sweep(args.running, args.expired, args.sweeps, pg_server, template)
        except Exception:
            for log in sorted(folder.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        import celery
        import kombu

        versions = (
            f"Celery {celery.__version__}, Kombu {kombu.__version__}, Postgres {pg_server.version}"
        )
        bench.figures["load"] = (load_start, os.getloadavg()[0])
        section = report(bench.figures, command, versions)
        print(section)
        thr, sw = bench.figures["throughput"], bench.figures["sweep"]
        print("--- profile of 20 in-process minimal executions (cumulative)")
        print("\n".join(thr["profile"].splitlines()[:45]))
        print("--- profile of one sweep with requeues (tottime)")
        print("\n".join(sw["profile"].splitlines()[:35]))
        print(json.dumps({"elapsed_s": round(time.monotonic() - begun, 1)}))
    if args.write:
        write_section(section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
