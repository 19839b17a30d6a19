"""Lease renewal latency: Redis renew beside a raw Redis PING, and the SQL back end for comparison.

    .venv/bin/python bench/leases.py [--iterations N] [--redis-url URL] [--pg-url URL] [--write]

Without URLs it starts a throwaway redis-server and Postgres from the local binaries (as the tests
do). Calls are interleaved (PING, renew, PING, renew, ...) so both see the same machine load, and
the goal is read as a ratio: a renewal should cost one round trip, i.e. about one PING, and stay
at or under 1 ms at p50. `--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from docs_section import DOC, write_section

ROOT = Path(__file__).resolve().parents[1]
TTL = 120.0


@dataclass
class Series:
    label: str
    samples_ns: list[int]

    def quantile(self, q: float) -> float:
        """The q-quantile in milliseconds (nearest rank)."""
        ordered = sorted(self.samples_ns)
        index = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
        return ordered[index] / 1e6

    @property
    def p50(self) -> float:
        return self.quantile(0.50)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples_ns) / 1e6


def interleaved(calls: dict[str, Callable[[], object]], iterations: int) -> dict[str, Series]:
    """Time every call once per iteration, in turn, so load spikes hit all of them alike."""
    series = {label: Series(label, []) for label in calls}
    clock = time.perf_counter_ns
    for _ in range(iterations):
        for label, call in calls.items():
            started = clock()
            call()
            series[label].samples_ns.append(clock() - started)
    return series


@contextmanager
def services(redis_url: str | None, pg_url: str | None) -> Iterator[tuple[str, str]]:
    """The given URLs, or throwaway servers from the local binaries (the tests' helpers)."""
    with ExitStack() as stack:
        if redis_url is None or pg_url is None:
            sys.path.insert(0, str(ROOT))
            from tests.services import PostgresServer, RedisServer

        if redis_url is None:
            redis_server = RedisServer()
            redis_server.start()
            stack.callback(redis_server.close)
            redis_url = redis_server.url
        if pg_url is None:
            from orchestrator.store.migrations import upgrade

            pg_server = PostgresServer()
            stack.callback(pg_server.stop)
            pg_server.start()
            pg_url = pg_server.url(pg_server.create_database())
            upgrade(pg_url)
        yield redis_url, pg_url


def commands_per_renewal(redis_url: str, renewals: int = 200) -> float:
    """Top-level Redis commands sent per renewal, read from the server's command statistics."""
    import redis

    from orchestrator.leases.redis import RedisLeaseBackend

    client = redis.Redis.from_url(redis_url)
    backend = RedisLeaseBackend.from_url(redis_url)
    try:
        token = backend.acquire("bench:count", "bench", TTL)
        if token is None:
            raise RuntimeError("could not take the benchmark lease")
        client.config_resetstat()
        for _ in range(renewals):
            if not backend.renew("bench:count", token, TTL):
                raise RuntimeError("Redis renewal refused")
        stats = client.info("commandstats")
        # Commands a script runs inside Redis are counted too; only EVALSHA/EVAL are requests.
        requests = sum(
            int(value["calls"])
            for name, value in stats.items()
            if name in {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_script"}
        )
        return requests / renewals
    finally:
        backend.close()
        client.close()


def run(iterations: int, redis_url: str, pg_url: str) -> list[Series]:
    import psycopg
    import redis

    from orchestrator.leases.redis import RedisLeaseBackend
    from orchestrator.leases.sql import SqlLeaseBackend
    from orchestrator.store.db import Database

    client = redis.Redis.from_url(redis_url)
    redis_leases = RedisLeaseBackend.from_url(redis_url)
    database = Database.from_url(pg_url)
    sql_leases = SqlLeaseBackend(database)
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    raw_pg = psycopg.connect(plain, autocommit=True)
    try:
        redis_token = redis_leases.acquire("bench:renew", "bench", TTL)
        sql_token = sql_leases.acquire("bench:renew", "bench", TTL)
        if redis_token is None or sql_token is None:
            raise RuntimeError("could not take the benchmark leases")

        # Checked with `if`, not `assert`: under `python -O` an assert would skip the call itself.
        def redis_renew() -> None:
            if not redis_leases.renew("bench:renew", redis_token, TTL):
                raise RuntimeError("Redis renewal refused")

        def sql_renew() -> None:
            if not sql_leases.renew("bench:renew", sql_token, TTL):
                raise RuntimeError("SQL renewal refused")

        calls: dict[str, Callable[[], object]] = {
            "Redis PING (raw redis-py)": client.ping,
            "Redis lease renew (EVALSHA)": redis_renew,
            "Postgres SELECT 1 (raw psycopg, autocommit)": lambda: raw_pg.execute("SELECT 1"),
            "Postgres lease renew (SQL back end)": sql_renew,
        }
        interleaved(calls, max(100, iterations // 10))  # warm-up: connections, caches, scripts
        return list(interleaved(calls, iterations).values())
    finally:
        raw_pg.close()
        redis_leases.close()
        database.dispose()
        client.close()


def report(series: list[Series], per_renewal: float, iterations: int, command: str) -> str:
    by_label = {item.label: item for item in series}
    ping = by_label["Redis PING (raw redis-py)"]
    renew = by_label["Redis lease renew (EVALSHA)"]
    select_one = by_label["Postgres SELECT 1 (raw psycopg, autocommit)"]
    lines = [
        "## Lease renewal",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"Python {platform.python_version()}, {iterations} interleaved calls each, loopback "
        "servers started by the benchmark. Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        "| call | p50 ms | p99 ms | mean ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {s.label} | {s.p50:.3f} | {s.p99:.3f} | {s.mean:.3f} |" for s in series]
    goal_met = renew.p50 <= 1.0
    lines += [
        "",
        f"- Redis renew / PING, same run: p50 {renew.p50 / ping.p50:.2f}x, "
        f"p99 {renew.p99 / ping.p99:.2f}x. Requests sent per renewal (server command "
        f"statistics): {per_renewal:.2f}.",
        f"- Goal, one round trip and p50 <= 1 ms: {'met' if goal_met else 'NOT met'} "
        f"(p50 {renew.p50:.3f} ms).",
        f"- SQL back end on Postgres / raw SELECT 1: p50 "
        f"{by_label['Postgres lease renew (SQL back end)'].p50 / select_one.p50:.2f}x "
        "(a transaction: pool checkout, BEGIN, UPDATE, COMMIT; no ping, the checkouts come "
        "closer together than the pool's 0.5 s bypass window).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--pg-url", help="use this Postgres database (migrated) instead")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    command = f".venv/bin/python bench/leases.py --iterations {args.iterations} --write"
    with services(args.redis_url, args.pg_url) as (redis_url, pg_url):
        series = run(args.iterations, redis_url, pg_url)
        per_renewal = commands_per_renewal(redis_url)
    section = report(series, per_renewal, args.iterations, command)
    print(section)
    if args.write:
        write_section("leases", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
