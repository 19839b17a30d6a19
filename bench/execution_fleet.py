"""What bench/executions.py runs beside the orchestrator: the raw Celery baseline, the child
processes (workers, sweeper, raw worker), the scripted rounds, the servers, the statistics.

    python bench/execution_fleet.py N   # the raw Celery worker, N processes (the bench starts it)
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RAW_QUEUE = "bench-raw"
RAW_START, RAW_COMMITS = "bench.raw.start", "bench.raw.commits"
RAW_FLOOR, RAW_REPLAY = "bench.raw.floor", "bench.raw.replay"
RAW_STARTS_KEY, RAW_DONE_KEY = "bench:raw:starts", "bench:raw:done"
LEASE, RENEW, SWEEP = 3.0, 1.0, 1.0
#: Every worker of the comparisons (ours, raw Celery, Procrastinate) is one process running
#: this many jobs at once: the orchestrator's default pool is `threads` (executions wait on the
#: model), and Procrastinate's worker is one asyncio process with `concurrency` jobs, so equal
#: concurrency means one process and the same number of concurrent jobs on every side.
POOL, CONCURRENCY = "threads", 2
MINIMAL, SLOW, REPORT_ONLY = "minimal", "slow", "report-only"

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
    local = threading.local()

    def state() -> dict[str, Any]:
        """One Redis client and one psycopg connection per pool process or thread, as the
        orchestrator's worker keeps a pooled connection per concurrent execution."""
        current: dict[str, Any] | None = getattr(local, "state", None)
        if current is None or current.get("pid") != os.getpid():  # forget a parent's
            current = local.state = {"pid": os.getpid()}
        return current

    def redis_client() -> Any:
        import redis

        mine = state()
        if "redis" not in mine:
            mine["redis"] = redis.Redis.from_url(redis_url)
        return mine["redis"]

    def pg_client() -> Any:
        import psycopg

        mine = state()
        if "pg" not in mine:
            mine["pg"] = psycopg.connect(os.environ["BENCH_PG_DSN"], autocommit=True)
        return mine["pg"]

    @app.task(name=RAW_START)  # type: ignore[untyped-decorator]
    def start() -> None:
        redis_client().rpush(RAW_STARTS_KEY, repr(time.time()))

    @app.task(name=RAW_COMMITS)  # type: ignore[untyped-decorator]
    def commits(count: int) -> None:
        client, pg = redis_client(), pg_client()
        for _ in range(count):
            # One transaction per commit, as the service's `db.transaction()` blocks are.
            with pg.transaction():
                pg.execute("INSERT INTO bench_raw (at) VALUES (now())")
        client.rpush(RAW_DONE_KEY, repr(time.time()))

    def lease_calls(client: Any, name: str, token: str, redis_calls: int) -> None:
        """The lease's renewals and release by EVALSHA, as the lease back end sends them, and
        the round's PUBLISH: the Redis commands of an execution after its SET NX."""
        from orchestrator.leases.redis import _RELEASE, _RENEW

        mine = state()
        if "scripts" not in mine:  # EVALSHA, as the lease back end sends them
            mine["scripts"] = (client.register_script(_RENEW), client.register_script(_RELEASE))
        renew, release = mine["scripts"]
        for _ in range(redis_calls - 3):
            renew(keys=[name], args=[token, 3000, time.time_ns() // 1_000_000])
        client.publish("bench:floor", token)
        release(keys=[name], args=[token])

    @app.task(name=RAW_FLOOR)  # type: ignore[untyped-decorator]
    def floor(autocommits: int, transactions: list[int], redis_calls: int) -> None:
        """The round trips of one execution, sent by the raw drivers, with no agent: a lease
        taken, renewed and released (the lease back end's own commands and scripts), a
        PUBLISH; statements sent in autocommit, then each transaction as a row lock, reads of
        that row and an INSERT, as a fenced write is."""
        client, pg = redis_client(), pg_client()
        name, token = f"bench:floor:{time.time_ns()}", str(os.getpid())
        now_ms = time.time_ns() // 1_000_000
        client.set(name, f"{token}|{now_ms}|{now_ms}|bench", nx=True, px=3000, get=True)
        row_id = 0
        for _ in range(autocommits):
            inserted = pg.execute("INSERT INTO bench_raw (at) VALUES (now()) RETURNING id")
            row_id = inserted.fetchone()[0]
        for statements in transactions:
            with pg.transaction():
                pg.execute("SELECT id FROM bench_raw WHERE id = %s FOR UPDATE", (row_id,))
                for _ in range(statements - 2):
                    pg.execute("SELECT at FROM bench_raw WHERE id = %s", (row_id,)).fetchone()
                pg.execute("INSERT INTO bench_raw (at) VALUES (now())")
        lease_calls(client, name, token, redis_calls)
        client.rpush(RAW_DONE_KEY, repr(time.time()))

    @app.task(name=RAW_REPLAY)  # type: ignore[untyped-decorator]
    def replay(path: str, dsn: str, index: int, redis_calls: int) -> None:
        """One execution's own statements (bench/statement_replay.py), sent again by raw
        psycopg on a copy of the database taken before it ran, with the floor's Redis calls."""
        from statement_replay import Replayer, load

        client, mine = redis_client(), state()
        if mine.get("replayer_dsn") != dsn:
            mine["replayer"], mine["replayer_dsn"] = Replayer(dsn), dsn
        name, token = f"bench:replay:{time.time_ns()}", str(os.getpid())
        now_ms = time.time_ns() // 1_000_000
        client.set(name, f"{token}|{now_ms}|{now_ms}|bench", nx=True, px=3000, get=True)
        mine["replayer"].run(load(path)[index])
        lease_calls(client, name, token, redis_calls)
        client.rpush(RAW_DONE_KEY, repr(time.time()))

    return app


def raw_worker_main(concurrency: int) -> None:
    app = raw_celery(os.environ["BENCH_REDIS_URL"])
    app.worker_main(
        [
            "worker",
            "--pool",
            POOL,
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

    def worker(self, concurrency: int = CONCURRENCY, pool: str = POOL) -> Proc:
        """`orchestrator worker`, on the pool of the raw Celery worker beside it."""
        orchestrator = str(Path(sys.executable).with_name("orchestrator"))
        argv = [orchestrator, "worker", "--concurrency", str(concurrency), "--loglevel", "INFO"]
        return self.start("worker", [*argv, "--pool", pool])

    def sweeper(self) -> Proc:
        return self.start(
            "sweeper", [str(Path(sys.executable).with_name("orchestrator")), "sweeper"]
        )

    def raw_worker(self, concurrency: int = CONCURRENCY) -> Proc:
        argv = [sys.executable, str(Path(__file__).resolve()), str(concurrency)]
        return self.start("raw-worker", argv)

    def procrastinate_worker(self, concurrency: int = CONCURRENCY) -> Proc:
        script = Path(__file__).resolve().with_name("procrastinate_baseline.py")
        return self.start("procrastinate", [sys.executable, str(script), str(concurrency)])

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()


# --------------------------------------------------------------------------- scripts


def minimal_turns() -> list[dict[str, Any]]:
    """The minimal round: query (the evidence a completed node and report cite), publish a plan
    (one completed node), save a report, answer."""
    from tests.executions_support import node, plan_call, query_call, report_call

    return [
        {"tool_calls": [query_call()]},
        {"tool_calls": [plan_call("c1", "r1", [node("a", "completed")])]},
        {"tool_calls": [report_call("c2", "completed")]},
        {"content": "done"},
    ]


def report_only_turns() -> list[dict[str, Any]]:
    """A round that only saves a failed report and answers: what the orchestration costs on its
    own (claim, lease, transcript, report, the generation's end) with the agent's work left out."""
    from tests.executions_support import report_call

    return [{"tool_calls": [report_call("c1", "failed")]}, {"content": "done"}]


def slow_turns(delay_s: float) -> list[dict[str, Any]]:
    """A round that queries and publishes a plan, then thinks for `delay_s` (the window for a
    SIGKILL)."""
    from tests.executions_support import node, plan_call, query_call, report_call

    return [
        {"tool_calls": [query_call(), plan_call("c1", "r1", [node("a", "running")])]},
        {"delay_s": delay_s, "tool_calls": [plan_call("c2", "r2", [node("a", "completed")])]},
        {"tool_calls": [report_call("c3", "completed")]},
        {"content": "done"},
    ]


# --------------------------------------------------------------------------- servers


#: The pids of the servers `servers()` started and their roles, for `cpu.cpu_seconds`.
SERVER_PIDS: dict[int, str] = {}


@contextmanager
def servers(durable: bool = False) -> Iterator[tuple[Any, str, str, str]]:
    from orchestrator.store.migrations import upgrade
    from tests.services import PostgresServer, RedisServer

    with ExitStack() as stack:
        redis_server = RedisServer()
        redis_server.start()
        stack.callback(redis_server.close)
        pg_server = PostgresServer(durable=durable)
        stack.callback(pg_server.stop)
        pg_server.start()
        template = pg_server.create_database()
        upgrade(pg_server.url(template))
        postmaster = (pg_server.data / "postmaster.pid").read_text().split("\n", 1)[0]
        SERVER_PIDS.update({int(postmaster): "postgres"})
        if redis_server.process is not None:
            SERVER_PIDS.update({redis_server.process.pid: "redis"})
        name = pg_server.create_database(template=template)
        yield pg_server, pg_server.url(name), redis_server.url, template


if __name__ == "__main__":
    raw_worker_main(int(sys.argv[1]))
