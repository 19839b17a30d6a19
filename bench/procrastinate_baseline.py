"""The Procrastinate baseline of bench/executions.py: a Postgres-only job queue on the same server.

    python bench/procrastinate_baseline.py N   # the Procrastinate worker, concurrency N

Procrastinate keeps its queue in Postgres (its own database here, `procrastinate_jobs`), fetches
a job with `SELECT ... FOR UPDATE SKIP LOCKED`, is woken by LISTEN/NOTIFY and runs async jobs
`concurrency` at a time in one process. Its job makes as many single-INSERT transactions on a
kept connection as one minimal execution makes commits (the benchmark counts them), then
reports its end on Redis as the raw Celery tasks do. Procrastinate's own fetch and finish of
the job are two more commits on top, which the job's count does not include.

The worker is a process of its own, so /proc can charge it its CPU.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any

__all__ = ["DONE_KEY", "burst", "make_app", "prepare"]

QUEUE = "bench-procrastinate"
TASK = "bench.procrastinate.commits"
DONE_KEY = "bench:procrastinate:done"


def make_app(conninfo: str, *, pool_size: int | None = None) -> Any:
    """A Procrastinate app on `conninfo` with the benchmark's one task registered."""
    import procrastinate

    kwargs = {} if pool_size is None else {"min_size": pool_size, "max_size": pool_size}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo, **kwargs))
    state: dict[str, Any] = {}

    async def job_connection() -> Any:
        """The job's own connections, one per concurrent job (a kept connection, as the raw
        Celery task has one per pool process)."""
        import psycopg_pool

        if "pool" not in state:
            size = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "1"))
            pool = psycopg_pool.AsyncConnectionPool(
                os.environ["BENCH_PG_DSN"],
                min_size=size,
                max_size=size,
                kwargs={"autocommit": True},
                open=False,
            )
            await pool.open(wait=True)
            state["pool"] = pool
        return state["pool"]

    async def redis_client() -> Any:
        import redis.asyncio

        if "redis" not in state:
            state["redis"] = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        return state["redis"]

    @app.task(name=TASK, queue=QUEUE)  # type: ignore[untyped-decorator]
    async def commits(count: int) -> None:
        pool = await job_connection()
        async with pool.connection() as conn:
            for _ in range(count):
                async with conn.transaction():
                    await conn.execute("INSERT INTO bench_raw (at) VALUES (now())")
        await (await redis_client()).rpush(DONE_KEY, repr(time.time()))

    return app


def prepare(pg_server: Any) -> str:
    """A database of its own on the benchmark's Postgres, with Procrastinate's schema; its DSN."""
    name = pg_server.create_database()
    conninfo = pg_server.url(name).replace("postgresql+psycopg", "postgresql")

    async def apply() -> None:
        app = make_app(conninfo)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())
    return conninfo


def burst(conninfo: str, redis_url: str, count: int, commits: int) -> float:
    """Defer `count` jobs one after another, wait for all; seconds from the first defer to the
    last job's end (the orchestrator's burst is timed the same way)."""

    async def run() -> float:
        import redis.asyncio

        app = make_app(conninfo, pool_size=1)
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            async with app.open_async():
                await client.delete(DONE_KEY)
                task = app.tasks[TASK]
                first = time.time()
                for _ in range(count):
                    await task.defer_async(count=commits)
                ends = []
                for _ in range(count):
                    popped = await client.blpop([DONE_KEY], timeout=60)
                    if popped is None:
                        raise RuntimeError("Procrastinate jobs did not finish within 60 s")
                    ends.append(float(popped[1]))
                return max(ends) - first
        finally:
            await client.aclose()

    return asyncio.run(run())


def worker_main(concurrency: int) -> None:
    """Procrastinate's worker with `concurrency` concurrent jobs, until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ["BENCH_PROCRASTINATE_CONCURRENCY"] = str(concurrency)
    app = make_app(os.environ["BENCH_PROCRASTINATE_DSN"])

    async def run() -> None:
        async with app.open_async():
            print("procrastinate worker ready.", flush=True)
            await app.run_worker_async(queues=[QUEUE], concurrency=concurrency)

    asyncio.run(run())


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
