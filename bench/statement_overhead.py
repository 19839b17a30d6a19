"""What one SQL statement costs the worker's CPU, by how it is sent: raw psycopg beside
SQLAlchemy Core, on a kept connection and through the store's pool, and the store's own way
(`store.driver`) beside the pooled autocommit checkout it replaced (the removed
`Database.single_statement`, inlined here as the "before").

    .venv/bin/python bench/statement_overhead.py [--blocks 40] [--calls 50] [--write]

An execution sends about two dozen statements, so the per-statement overhead of the layers above
the driver is a large part of what it spends over the same round trips sent by raw drivers
(bench/executions.py). Two statements: the shape of a fenced write (a CTE and an INSERT ...
RETURNING, sent in autocommit) and a read of one row by primary key inside a transaction. The
ways are timed in turn, `--calls` each per block, so load on the machine hits them alike; the
figure is CPU time of this process per statement (process_time), the median over the blocks
and the best block. A throwaway Postgres is started from the local binaries (as the tests do).
`--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, servers

WRITE_SA = (
    "WITH live AS (SELECT 1 AS one) INSERT INTO bench_rows (name, number, body) "
    "SELECT CAST(:name AS varchar), CAST(:number AS integer), CAST(:body AS jsonb) "
    "FROM live RETURNING id"
)
WRITE_RAW = WRITE_SA.replace(":name", "%(name)s").replace(":number", "%(number)s")
WRITE_RAW = WRITE_RAW.replace(":body", "%(body)s")
READ_RAW = "SELECT id, name, number, body FROM bench_rows WHERE id = %(id)s"
OWN_POOL = "write: SQLAlchemy, an engine in autocommit with a pool of its own"
CHECKOUT = "write: SQLAlchemy, a pooled connection checked out in autocommit (the store before)"
RAW_READ = "read in a transaction: raw psycopg, kept connection"
SA_READ = "read in a transaction: SQLAlchemy Core, kept connection"
STORE_WRITE = "write: store.driver.rows, a kept autocommit connection (the store)"
PARAMS = {"name": "a name", "number": 3, "body": '{"status": "succeeded", "result": [1, 2, 3]}'}


def ways(url: str) -> tuple[dict[str, Callable[[], Any]], Callable[[], None]]:
    from sqlalchemy import Column, Integer, MetaData, String, Table, select, text
    from sqlalchemy.dialects.postgresql import JSONB

    from orchestrator.store.db import Database
    from orchestrator.store.driver import rows as driver_rows

    db = Database.from_url(url)
    meta = MetaData()
    rows = Table(
        "bench_rows",
        meta,
        Column("id", Integer, primary_key=True),
        Column("name", String),
        Column("number", Integer),
        Column("body", JSONB),
    )
    meta.create_all(db.engine)
    write = text(WRITE_SA)
    with db.transaction() as conn:
        first = conn.execute(write, PARAMS).scalar_one()
    read = select(rows).where(rows.c.id == first)
    kept_sa = db.engine.connect()
    kept_sa_auto = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    kept_raw = db.engine.raw_connection()
    driver = kept_raw.driver_connection
    assert driver is not None
    driver.autocommit = True

    def raw_write() -> Any:
        with driver.cursor() as cur:
            cur.execute(WRITE_RAW, PARAMS)
            return cur.fetchall()

    def pooled_raw_write() -> Any:
        fairy = db.engine.raw_connection()
        try:
            conn = fairy.driver_connection
            assert conn is not None
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(WRITE_RAW, PARAMS)
                found = cur.fetchall()
            conn.autocommit = False
            return found
        finally:
            fairy.close()

    def sa_kept_write() -> Any:
        return kept_sa_auto.execute(write, PARAMS).all()

    from sqlalchemy import create_engine

    autocommit_engine = create_engine(db.engine.url, isolation_level="AUTOCOMMIT", pool_size=5)

    def own_pool_write() -> Any:
        with autocommit_engine.connect() as conn:
            return conn.execute(write, PARAMS).all()

    def checkout_autocommit_write() -> Any:
        # What `Database.single_statement` did, before the store sent such statements on
        # `store.driver` (and the method went): a pooled connection checked out, switched to
        # autocommit, and switched back and reset on its return.
        with db.engine.connect() as conn:
            return conn.execution_options(isolation_level="AUTOCOMMIT").execute(write, PARAMS).all()

    def store_write() -> Any:
        return driver_rows(db.engine, write, PARAMS)

    read_driver = db.engine.raw_connection().driver_connection  # in a transaction per read
    assert read_driver is not None

    def raw_read() -> Any:
        with read_driver.cursor() as cur:
            cur.execute(READ_RAW, {"id": first})
            found = cur.fetchall()
        read_driver.commit()
        return found

    def sa_kept_read() -> Any:
        with kept_sa.begin():
            return kept_sa.execute(read).all()

    def store_read() -> Any:
        with db.transaction(readonly=True) as conn:
            return conn.execute(read).all()

    calls = {
        "write: raw psycopg, kept connection": raw_write,
        "write: raw psycopg through the store's pool": pooled_raw_write,
        "write: SQLAlchemy Core, kept connection": sa_kept_write,
        OWN_POOL: own_pool_write,
        CHECKOUT: checkout_autocommit_write,
        STORE_WRITE: store_write,
        RAW_READ: raw_read,
        SA_READ: sa_kept_read,
        "read in a transaction: SQLAlchemy through Database.transaction (the store)": store_read,
    }

    def close() -> None:
        kept_sa.close()
        kept_sa_auto.close()
        kept_raw.close()
        autocommit_engine.dispose()
        db.dispose()

    return calls, close


def measure(calls: dict[str, Callable[[], Any]], blocks: int, per_block: int) -> dict[str, Any]:
    for call in calls.values():  # warm-up: prepared statements, caches, pool
        for _ in range(per_block):
            call()
    blocks_us: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(blocks):
        for label, call in calls.items():
            started = time.process_time()
            for _ in range(per_block):
                call()
            blocks_us[label].append((time.process_time() - started) / per_block * 1e6)
    return blocks_us


def report(blocks_us: dict[str, list[float]], command: str, load: tuple[float, float]) -> str:
    median = {label: statistics.median(v) for label, v in blocks_us.items()}
    write_floor = median["write: raw psycopg, kept connection"]
    read_floor = median[RAW_READ]
    sa_read = median[SA_READ]
    lines = [
        "## Statement overhead",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {load[0]:.1f} at the "
        f"start and {load[1]:.1f} at the end (2 cores shared). Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        "| how the statement is sent | CPU per statement, median us | best block, us | over raw |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, samples in blocks_us.items():
        floor = write_floor if label.startswith("write") else read_floor
        lines.append(
            f"| {label} | {median[label]:.0f} | {min(samples):.0f} | "
            f"+{median[label] - floor:.0f} us ({median[label] / floor:.2f}x) |"
        )
    store_write = median[STORE_WRITE]
    checkout = median[CHECKOUT]
    kept_write = median["write: SQLAlchemy Core, kept connection"]
    lines += [
        "",
        f"- A fenced-write-shaped statement sent alone costs the store {store_write:.0f} us of "
        f"CPU on `store.driver`'s kept autocommit connections (a trigger's insert, a claim, a "
        f"fenced write), against {write_floor:.0f} us sent raw on a kept connection. Through "
        f"a pooled connection checked out in autocommit, as `Database.single_statement` sent "
        f"it before, it cost {checkout:.0f} us: {kept_write - write_floor:.0f} us of "
        f"SQLAlchemy's execution of the statement and {checkout - kept_write:.0f} us of the "
        "checkout and its return (the pre-ping bookkeeping, the isolation level set and reset, "
        "the reset on return). An engine kept in autocommit, with a pool of its own, costs "
        f"{median[OWN_POOL]:.0f} us.",
        "- The reads are one row by primary key, each its own transaction (BEGIN, SELECT, "
        f"COMMIT): SQLAlchemy on a kept connection adds {sa_read - read_floor:.0f} us to raw "
        f"psycopg's median, {min(blocks_us[SA_READ]) - min(blocks_us[RAW_READ]):.0f} us to its "
        "best block.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40, help="interleaved blocks")
    parser.add_argument("--calls", type=int, default=50, help="calls of each way per block")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    command = (
        f".venv/bin/python bench/statement_overhead.py --blocks {args.blocks} --calls "
        f"{args.calls}{' --write' if args.write else ''}"
    )
    load_start = os.getloadavg()[0]
    with servers() as (_pg, url, _redis_url, _template):
        calls, close = ways(url)
        try:
            blocks_us = measure(calls, args.blocks, args.calls)
        finally:
            close()
    section = report(blocks_us, command, (load_start, os.getloadavg()[0]))
    print(section)
    if args.write:
        write_section("statement-overhead", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
