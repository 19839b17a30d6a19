"""Benchmark: publishing a 40-node / 80-edge plan on Postgres, beside a plain insert of its JSON.

Measures, interleaved in one run so both see the same machine load:
  * publish   - PlanService.publish_execution_plan: validation (with the previous revision),
                fence-free transaction (session lock, request_id look-up, previous revision,
                insert) and the Redis wake-up after commit;
  * plain     - one INSERT of the same nodes/edges JSON into a scratch JSONB table, own transaction;
  * validate  - validate_plan alone (structure + rules against the previous revision).

Run:  .venv/bin/python bench/plan_publish.py [--iterations 1000] [--url URL] [--redis-url URL]
      [--write]
Without --url / --redis-url a throwaway Postgres / redis-server is started from local binaries;
--write replaces this benchmark's section of docs/benchmarks.md (other sections stay).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from docs_section import DOC, write_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from orchestrator.domain.plans import validate_plan
from orchestrator.events import NullNotifier, PlanNotifier, RedisNotifier
from orchestrator.services.plans import PlanService
from orchestrator.services.sessions import SessionService
from orchestrator.store import Database
from orchestrator.store.migrations import upgrade


def big_plan(request_id: str) -> dict[str, Any]:
    """40 nodes, 80 edges, realistic text sizes, acyclic (edges go from lower to higher index)."""
    statuses = ["completed", "running", "pending", "waiting", "skipped"]
    nodes = []
    for i in range(40):
        human = i % 7 == 0
        # A person closes a human node, never the agent's publish (`human_node`): it waits.
        status = "waiting" if human else statuses[i % len(statuses)]
        nodes.append(
            {
                "id": f"step-{i:02d}",
                "title": f"Check pressure zone {i} against SCADA history",
                "actor": "human" if human else "agent",
                "description": "Compare the last 24 h of readings with the complaint window. " * 3,
                "evidence": f"scada:zone/{i} 2026-12-01T10:00Z..11:00Z"
                if status == "completed"
                else "",
                "status": status,
                "reason": "crew dispatched, result due 14:00" if status == "waiting" else None,
            }
        )
    edges = []
    for i in range(40):
        for step in (1, 3):
            if i + step < 40 and len(edges) < 80:
                edges.append({"from": f"step-{i:02d}", "to": f"step-{i + step:02d}"})
    for i in range(40):
        if len(edges) >= 80:
            break
        if i + 5 < 40:
            edges.append({"from": f"step-{i:02d}", "to": f"step-{i + 5:02d}", "label": "if high"})
    assert len(nodes) == 40
    assert len(edges) == 80
    return {"request_id": request_id, "title": "Water quality complaint", "reason": "update",
            "nodes": nodes, "edges": edges}  # fmt: skip


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


@contextlib.contextmanager
def services(url: str | None, redis_url: str | None) -> Iterator[tuple[str, str | None]]:
    """The given URLs, or throwaway servers from the test harness."""
    stack = contextlib.ExitStack()
    with stack:
        if url is None:
            from tests.services import PostgresServer

            pg = PostgresServer()
            pg.start()
            stack.callback(pg.stop)
            url = pg.url(pg.create_database())
        if redis_url is None:
            from tests.services import RedisServer, ServiceMissing

            server = RedisServer()
            try:
                server.start()
                stack.callback(server.close)
                redis_url = server.url
            except ServiceMissing:
                print("redis-server missing: publishing without the wake-up", file=sys.stderr)
        yield url, redis_url


def run(url: str, redis_url: str | None, iterations: int, warmup: int) -> dict[str, list[float]]:
    upgrade(url)
    db = Database.from_url(url)
    notifier: PlanNotifier = RedisNotifier(redis_url) if redis_url else NullNotifier()
    with db.transaction() as conn:
        conn.execute(
            text("CREATE TABLE IF NOT EXISTS bench_plain (id serial PRIMARY KEY, doc jsonb)")
        )
    service = PlanService(db, notifier)
    session_id = (
        SessionService(db).create_session(purpose="ordinary_chat", title="bench").session_id
    )
    template = big_plan("seed")
    service.publish_execution_plan(session_id, template)
    previous = service.latest(session_id)
    assert previous is not None
    doc = {"nodes": template["nodes"], "edges": template["edges"]}

    def plain() -> None:
        with db.transaction() as conn:
            conn.execute(
                text("INSERT INTO bench_plain (doc) VALUES (CAST(:doc AS jsonb))"),
                {"doc": __import__("json").dumps(doc)},
            )

    results: dict[str, list[float]] = {"publish": [], "plain": [], "validate": []}
    for i in range(warmup + iterations):
        body = big_plan(f"req-{i}")
        samples = (
            timed(lambda body=body: service.publish_execution_plan(session_id, body)),  # type: ignore[misc]
            timed(plain),
            timed(lambda body=body: validate_plan(body, previous.nodes)),  # type: ignore[misc]
        )
        if i >= warmup:
            for name, value in zip(("publish", "plain", "validate"), samples, strict=True):
                results[name].append(value)
    revisions = service.latest_number(session_id)
    assert revisions == warmup + iterations + 1, revisions
    if isinstance(notifier, RedisNotifier):
        notifier.close()
    db.dispose()
    return results


GOAL_PUBLISH_MS, GOAL_VALIDATE_MS = 5.0, 0.3


def report(results: dict[str, list[float]], iterations: int, command: str) -> str:
    """The markdown section for docs/benchmarks.md."""
    p50 = {name: percentile(samples, 0.5) for name, samples in results.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    labels = {
        "publish": "publish_execution_plan (validation + transaction + Redis wake-up)",
        "plain": "plain INSERT of the same nodes/edges JSON (own transaction)",
        "validate": "validate_plan alone (structure + previous revision)",
    }
    lines = [
        "## Plan publish",
        "",
        f"Measured {stamp} on {platform.machine()}, Python {platform.python_version()}, "
        f"{iterations} interleaved iterations of a 40-node / 80-edge plan, loopback Postgres and "
        f"Redis started by the benchmark, {os.cpu_count()} cores shared (1-min load "
        f"{load:.1f}). Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        "| call | p50 ms | p99 ms | mean ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, samples in results.items():
        lines.append(
            f"| {labels[name]} | {p50[name]:.3f} | {percentile(samples, 0.99):.3f} "
            f"| {statistics.fmean(samples):.3f} |"
        )
    met = "met" if p50["publish"] <= GOAL_PUBLISH_MS else "NOT met"
    vmet = "met" if p50["validate"] <= GOAL_VALIDATE_MS else "NOT met"
    lines += [
        "",
        f"- publish / plain insert, same run: p50 {p50['publish'] / p50['plain']:.2f}x "
        f"(two more statements: the session row lock and one read of the latest revision and "
        f"any request_id match; plus the digest, validation and the wake-up).",
        f"- Goal publish p50 <= {GOAL_PUBLISH_MS:g} ms server side: {met} "
        f"({p50['publish']:.2f} ms).",
        f"- Goal validation <= {GOAL_VALIDATE_MS:g} ms per call: {vmet} "
        f"(p50 {p50['validate']:.3f} ms).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--url", help="postgresql+psycopg:// URL (default: a throwaway server)")
    parser.add_argument("--redis-url", help="redis:// URL (default: a throwaway redis-server)")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    with services(args.url, args.redis_url) as (url, redis_url):
        results = run(url, redis_url, args.iterations, args.warmup)
    print(f"plan publish, 40 nodes / 80 edges, {args.iterations} iterations, interleaved")
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, samples in results.items():
        print(
            f"{name:10} {percentile(samples, 0.5):8.3f} {percentile(samples, 0.99):8.3f} "
            f"{statistics.fmean(samples):8.3f}"
        )
    ratio = percentile(results["publish"], 0.5) / percentile(results["plain"], 0.5)
    print(f"publish / plain insert (p50): {ratio:.2f}x")
    if args.write:
        command = ".venv/bin/python bench/plan_publish.py " + " ".join(sys.argv[1:])
        write_section("plan-publish", report(results, args.iterations, command.strip()))
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
