"""What one minimal execution sends, counted in process: commits, statements, Redis commands,
the shape of each transaction; with its in-process wall and CPU time and a CPU profile.

bench/executions.py makes its baselines (raw Celery, raw drivers, Procrastinate) send what this
counts, so the comparisons stay fair as the execution changes.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from pathlib import Path
from typing import Any

from execution_fleet import MINIMAL, Series
from execution_report import by_library

__all__ = ["COUNTED", "commits_per_execution"]

#: What the throughput figures take over from the count, as they are.
COUNTED = (
    "commits",
    "autocommits",
    "statements",
    "transactions",
    "pings",
    "redis_calls",
    "by_library",
    "schema_ms",
    "profile",
)


def commits_per_execution(
    rt: Any, folder: Path, task_type: str = MINIMAL, outcome: str = "completed"
) -> dict[str, Any]:
    """Transactions and Redis calls of one execution of `task_type` (by default the minimal
    one), counted in process; each run must end with `outcome`."""
    import redis
    from sqlalchemy import event

    from orchestrator.agent.host import ToolHost
    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import Trigger
    from orchestrator.store import driver

    saved = rt.dispatcher
    rt.dispatcher = RecordingDispatcher()
    rt.__dict__.pop("tasks", None)
    rt.__dict__.pop("executions", None)
    counts = {"commit": 0, "autocommit": 0, "statement": 0, "ping": 0, "redis": 0}
    shape: list[int] = []  # statements of each transaction, in order

    def on_begin(_conn: Any) -> None:
        shape.append(0)

    def on_commit(_conn: Any) -> None:
        counts["commit"] += 1

    def on_statement(conn: Any, *_args: Any) -> None:
        counts["statement"] += 1
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            counts["autocommit"] += 1  # a statement sent in autocommit is its own commit
        elif shape:
            shape[-1] += 1

    def on_driver_statement(_sql: str, autocommit: bool) -> None:
        # store.driver sends the hottest statements past SQLAlchemy's events.
        counts["statement"] += 1
        if autocommit:
            counts["autocommit"] += 1
        elif shape:
            shape[-1] += 1

    dialect = rt.db.engine.dialect
    original_ping = dialect.do_ping

    def counting_ping(dbapi_conn: Any) -> bool:
        counts["ping"] += 1
        return bool(original_ping(dbapi_conn))

    original_execute = redis.Redis.execute_command

    def counting_execute(client: Any, *args: Any, **options: Any) -> Any:
        counts["redis"] += 1
        return original_execute(client, *args, **options)  # type: ignore[no-untyped-call]

    hooks = [
        (rt.db.engine, "begin", on_begin),
        (rt.db.engine, "commit", on_commit),
        (rt.db.engine, "before_cursor_execute", on_statement),
    ]
    try:
        run_times: list[float] = []
        cpu_times: list[float] = []
        for index in range(31):
            task_id = rt.tasks.trigger(Trigger(task_type=task_type, title="count")).task.task_id
            if index == 0:
                for target, name, hook in hooks:
                    event.listen(target, name, hook)
                driver.observers.append(on_driver_statement)
                setattr(redis.Redis, "execute_command", counting_execute)  # noqa: B010
                setattr(dialect, "do_ping", counting_ping)  # noqa: B010
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                result = rt.executions.run(
                    task_id, 1, worker="bench:inprocess", first_delivery=True
                )
            finally:
                if index == 0:
                    setattr(redis.Redis, "execute_command", original_execute)  # noqa: B010
                    setattr(dialect, "do_ping", original_ping)  # noqa: B010
                    for target, name, hook in hooks:
                        event.remove(target, name, hook)
                    driver.observers.remove(on_driver_statement)
            run_times.append((time.perf_counter() - started) * 1000)
            cpu_times.append((time.process_time() - cpu_started) * 1000)
            if result.outcome != outcome:
                raise RuntimeError(f"the {task_type} round ended {result.outcome}: {result.detail}")
        schema_ms = Series("schemas")
        host = ToolHost(rt.executions._tools(None), ledger=None)
        for _ in range(30):
            started = time.perf_counter()
            host.schemas()
            schema_ms.samples.append((time.perf_counter() - started) * 1000)
        # CPU time of this thread, not wall time: the machine is shared, and waits on the
        # servers are not its work. (The transcript's background writes run on another
        # thread, which the profiler does not see; `inprocess_cpu_ms` counts them.)
        profiler = cProfile.Profile(time.thread_time)
        for _ in range(20):
            task_id = rt.tasks.trigger(Trigger(task_type=task_type, title="profile")).task.task_id
            profiler.enable()
            rt.executions.run(task_id, 1, worker="bench:inprocess", first_delivery=True)
            profiler.disable()
    finally:
        rt.dispatcher = saved
        rt.__dict__.pop("tasks", None)
        rt.__dict__.pop("executions", None)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    (folder / "profile-execution.txt").write_text(text.getvalue())
    return {
        "by_library": by_library(profiler),
        "commits": counts["commit"] + counts["autocommit"],
        "autocommits": counts["autocommit"],
        "statements": counts["statement"],
        "transactions": [count for count in shape if count],
        "pings": counts["ping"],
        "redis_calls": counts["redis"],
        "schema_ms": schema_ms,
        "inprocess_ms": Series("inprocess", run_times[1:]),
        "inprocess_cpu_ms": Series("inprocess cpu", cpu_times[1:]),
        "profile": text.getvalue(),
    }
