"""What one fenced write costs by the way its SQL is sent: SQLAlchemy, raw psycopg, pipelined.

    .venv/bin/python bench/fenced_writes.py [--transactions N] [--rounds N] [--write]

A fenced write of an execution is a transaction of three statements: lock the task row and read
its generation and token, check a fact that must be read after the lock, insert the write. This
runs that transaction three ways on the same loopback Postgres (started from the local binaries,
fsync off as in the tests), rounds alternating so all see the same machine load:

1. SQLAlchemy Core on a pooled connection, as the store sends its statements;
2. raw psycopg on a kept connection, the same statements one after another;
3. raw psycopg in pipeline mode: BEGIN, the lock and the check in one round trip, then the insert
   and COMMIT in another.

For each it reports the wall time and the CPU per transaction: the client process's, and the
Postgres server processes' (from /proc). On a machine whose cores the client and the server share,
the rate of executions follows the CPU, not the wall time. `--write` replaces this benchmark's
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpu import cpu_seconds
from docs_section import DOC, write_section

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCHEMA = (
    "CREATE TABLE fenced_tasks (task_id text PRIMARY KEY, generation int, lease_token text, "
    "status text)",
    "INSERT INTO fenced_tasks VALUES ('t', 1, 'token', 'running')",
    "CREATE TABLE fenced_writes (id bigserial PRIMARY KEY, task_id text, generation int, "
    "body jsonb, at timestamptz)",
    "CREATE INDEX ON fenced_writes (task_id, generation)",
)
FENCE = (
    "SELECT status, lease_token FROM fenced_tasks WHERE task_id = %(task)s "
    "AND generation = %(generation)s FOR UPDATE"
)
# A later generation's rows: none, so the check reads an index and finds nothing, as a
# "report already saved?" check does before the report.
CHECK = (
    "SELECT EXISTS (SELECT 1 FROM fenced_writes WHERE task_id = %(task)s "
    "AND generation = %(later)s)"
)
INSERT = (
    "INSERT INTO fenced_writes (task_id, generation, body, at) "
    "VALUES (%(task)s, %(generation)s, CAST(%(body)s AS jsonb), now())"
)
PARAMS = {"task": "t", "generation": 1, "later": 2, "body": '{"summary": "done"}'}


def as_sqlalchemy(statement: str) -> str:
    """psycopg's `%(name)s` placeholders as SQLAlchemy's `:name`."""
    for name in PARAMS:
        statement = statement.replace(f"%({name})s", f":{name}")
    return statement


def held(row: Any) -> None:
    """The fence's row must name the live token; a benchmark of refused writes measures nothing."""
    if row is None or row[1] != "token":
        raise RuntimeError(f"the fence check read {row!r}")


def ways(url: str) -> dict[str, Callable[[], None]]:
    import psycopg
    from sqlalchemy import text

    from orchestrator.store.db import make_engine

    engine = make_engine(url)  # the store's engine: its pool, its ping rule
    fence, check, insert = (text(as_sqlalchemy(s)) for s in (FENCE, CHECK, INSERT))

    def sqlalchemy() -> None:
        with engine.connect() as conn, conn.begin():
            held(conn.execute(fence, PARAMS).one())
            assert conn.execute(check, PARAMS).scalar() is False
            conn.execute(insert, PARAMS)

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    plain = psycopg.connect(dsn)

    def raw() -> None:
        with plain.transaction():
            row = plain.execute(FENCE, PARAMS).fetchone()
            held(row)
            assert plain.execute(CHECK, PARAMS).fetchone() == (False,)
            plain.execute(INSERT, PARAMS)

    piped = psycopg.connect(dsn)

    def pipelined() -> None:
        with piped.pipeline() as pipeline:
            locked = piped.execute(FENCE, PARAMS)
            checked = piped.execute(CHECK, PARAMS)
            pipeline.sync()
            row = locked.fetchone()
            held(row)
            assert checked.fetchone() == (False,)
            piped.execute(INSERT, PARAMS)
            piped.commit()

    return {
        "SQLAlchemy Core, one statement after another": sqlalchemy,
        "raw psycopg, one statement after another": raw,
        "raw psycopg, pipeline mode (2 round trips)": pipelined,
    }


def timed(way: Callable[[], None], count: int) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) microseconds per transaction over `count` of them."""
    server = cpu_seconds({}).get("postgres", 0.0)
    client = time.process_time()
    wall = time.perf_counter()
    for _ in range(count):
        way()
    wall = time.perf_counter() - wall
    client = time.process_time() - client
    server = cpu_seconds({}).get("postgres", 0.0) - server
    return wall / count * 1e6, client / count * 1e6, server / count * 1e6


def run(url: str, transactions: int, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    import psycopg

    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)  # type: ignore[arg-type]
    candidates = ways(url)
    figures: dict[str, list[tuple[float, float, float]]] = {label: [] for label in candidates}
    for way in candidates.values():
        timed(way, 200)  # warm-up: connections, prepared statements
    for index in range(rounds):
        order = list(candidates.items())
        if index % 2:
            order.reverse()
        for label, way in order:
            figures[label].append(timed(way, transactions))
    return figures


def report(figures: dict[str, list[tuple[float, float, float]]], command: str) -> str:
    def median(label: str, column: int) -> float:
        return statistics.median(sample[column] for sample in figures[label])

    base = next(iter(figures))
    base_total = median(base, 1) + median(base, 2)
    lines = [
        "## Fenced write transaction, by how its SQL is sent",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, Python "
        f"{platform.python_version()}, a loopback Postgres started by the benchmark (fsync off, "
        "as in the tests). One transaction: lock a task row and read its token, check a fact "
        "read after the lock, insert a JSON row. Medians of the rounds, microseconds per "
        "transaction; CPU is user + system, the server's from /proc. Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        "| sent as | wall | client CPU | server CPU | CPU in all | CPU against SQLAlchemy |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label in figures:
        total = median(label, 1) + median(label, 2)
        lines.append(
            f"| {label} | {median(label, 0):.0f} | {median(label, 1):.0f} | "
            f"{median(label, 2):.0f} | {total:.0f} | {total / base_total:.2f}x |"
        )
    lines += [
        "",
        "- Reading it: the rate of executions on a machine whose cores the worker and the server "
        "share follows the CPU in all, not the wall time. Pipeline mode saves round trips, so "
        "wall time, but the server still handles every statement and the client still "
        "builds every one, so it does not save CPU. What a raw psycopg hot path would save is "
        "the client's SQLAlchemy share.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000, help="per round and way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    command = (
        f".venv/bin/python bench/fenced_writes.py --transactions {args.transactions} "
        f"--rounds {args.rounds} --write"
    )
    from tests.services import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        figures = run(server.url(server.create_database()), args.transactions, args.rounds)
    finally:
        server.stop()
    section = report(figures, command)
    print(section)
    if args.write:
        write_section("fenced-writes", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
