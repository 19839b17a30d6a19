"""The sweep phase of bench/executions.py: one sweep over many running executions, with and
without expiries, beside the lookup alone, the expiries requeued one at a time, and every lease
probed (the contrasts the batched-sweeps goal is read against)."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from execution_fleet import MINIMAL, Series

__all__ = ["measure"]


def measure(
    settings: Any,
    redis_client: Any,
    folder: Path,
    running: int,
    expired: int,
    repeats: int,
    pg_server: Any,
    template: str,
    compare_single: bool = False,
) -> dict[str, Any]:
    """The sweep's figures: `running` executions with live leases on a database of their own,
    `expired` of them running out before each of `repeats` timed sweeps; with `compare_single`
    the same expiries requeued one at a time too."""
    print(f"[4/4] one sweep over {running} running executions, {expired} expired", flush=True)
    import psycopg
    from sqlalchemy import select

    from orchestrator.leases.keys import lease_key, task_lease
    from orchestrator.runtime import build_runtime
    from orchestrator.store import executions as execution_store
    from orchestrator.store.tables import executions
    from orchestrator.store.types import utcnow
    from tests.executions_support import insert_running
    from workers.celery_app import CeleryDispatcher, make_celery

    name = pg_server.create_database(template=template)
    url = pg_server.url(name)
    settings = settings.model_copy(update={"database_url": url})
    rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
    bulk_pg = psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
    live: list[str] = []

    def add_running(count: int) -> None:
        """`count` running generation-1 executions with live leases, inserted in bulk."""
        pipe = redis_client.pipeline(transaction=False)
        stamp = int(time.time() * 1000)
        runs = [tuple(str(uuid.uuid4()) for _ in range(3)) for _ in range(count)]
        for task_id, _, token in runs:
            live.append(task_id)
            pipe.set(
                lease_key(task_lease(task_id)),
                f"{token}|{stamp}|{stamp}|bench:bulk",
                px=3_600_000,
            )
        with rt.db.transaction() as conn:
            insert_running(
                conn,
                runs,
                task_type=MINIMAL,
                worker="bench:bulk",
                lease_expires_at=utcnow() + timedelta(hours=1),
            )
        pipe.execute()

    def expire(count: int) -> list[str]:
        """The leases of `count` running executions ran out: mirror in the past, key gone."""
        batch = [live.pop(0) for _ in range(count)]
        bulk_pg.execute(
            "UPDATE executions SET lease_expires_at = now() - interval '1 second' "
            "WHERE task_id = ANY(%s) AND generation = 1",
            (batch,),
        )
        redis_client.delete(*[lease_key(task_lease(t)) for t in batch])
        return batch

    def lookup() -> int:
        with rt.db.transaction(readonly=True) as conn:
            return len(execution_store.expired_executions(conn, utcnow(), rt.sweeper.batch))

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
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                profile_text = text.getvalue()
                (folder / "profile-sweep.txt").write_text(profile_text)
            if len(swept.requeued) != len(batch):
                raise RuntimeError(f"the sweep requeued {len(swept.requeued)} of {len(batch)}")
            add_running(expired)  # back to `running` running executions
        # The same expiries requeued one at a time, as sweeps did before batching: a lease
        # read, a transaction and a publish for each (the same store function, batch of 1).
        from orchestrator.services.sweeper import LEASE_EXPIRED, SweepReport

        single = Series("one at a time")
        for _ in range(repeats if compare_single else 0):
            batch = expire(expired)
            t0 = time.perf_counter()
            with rt.db.transaction(readonly=True) as conn:
                found_rows = execution_store.expired_executions(conn, utcnow(), rt.sweeper.batch)
            one_by_one = SweepReport()
            for row in found_rows:
                rt.leases.get(task_lease(row.task_id))
                rt.sweeper.requeue_lost([(row.task_id, row.generation)], LEASE_EXPIRED, one_by_one)
            single.samples.append((time.perf_counter() - t0) * 1000)
            if len(one_by_one.requeued) != len(batch):
                raise RuntimeError("the one-at-a-time sweep missed expiries")
            add_running(expired)
        # The naive contrast: every running execution's lease probed, one call each.
        expire(expired)
        running_rows()
        t0 = time.perf_counter()
        rows = running_rows()
        missing = 0
        for row in rows:
            info = rt.leases.get(task_lease(row.task_id))
            if info is None or info.token != row.lease_token:
                missing += 1
        naive_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        rows = running_rows()
        pipe = redis_client.pipeline(transaction=False)
        for row in rows:
            pipe.get(lease_key(task_lease(row.task_id)))
        missing_pipelined = sum(1 for value in pipe.execute() if value is None)
        pipelined_ms = (time.perf_counter() - t0) * 1000
    finally:
        bulk_pg.close()
        rt.close()
    return {
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
        "single": single,
    }
