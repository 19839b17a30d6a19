"""The throughput phase of bench/executions.py: bursts of minimal executions and of the
orchestration alone (a round that only reports) beside raw Celery tasks and Procrastinate jobs
making as many commits, raw Celery tasks sending the execution's round trips with the raw
drivers, and the execution's own statements replayed (bench/statement_replay.py); each kind
twice, alternating, with the CPU of every process during each burst."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from cpu import cpu_seconds, cpu_used
from execution_counts import COUNTED, commits_per_execution
from execution_fleet import (
    MINIMAL,
    RAW_COMMITS,
    RAW_DONE_KEY,
    RAW_FLOOR,
    RAW_QUEUE,
    RAW_REPLAY,
    REPORT_ONLY,
    SERVER_PIDS,
)
from procrastinate_baseline import burst as procrastinate_burst
from statement_replay import check_replayed, record_on_copy

from tests.executions_support import wait_for

__all__ = ["REPLAY_WARMUP", "measure"]

#: Replayed executions sent before the timed bursts: the raw worker reads the traces, opens
#: its connections and prepares the statements, as the orchestrator's worker has by then.
REPLAY_WARMUP = 20


def measure(bench: Any, count: int, procrastinate_dsn: str, pg_server: Any, template: str) -> None:
    """The throughput phase of `bench` (a `Bench` of bench/executions.py): minimal executions
    and the orchestration alone beside raw Celery, Procrastinate, the round trips alone and the
    execution's own statements replayed, the bursts alternating; figures in `bench.figures`."""
    print(
        f"[2/4] throughput, {count} minimal executions vs {count} raw Celery tasks vs "
        f"{count} Procrastinate jobs, each twice",
        flush=True,
    )
    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import Trigger

    counted = commits_per_execution(bench.rt, bench.folder)
    commits = counted["commits"]
    alone = commits_per_execution(bench.rt, bench.folder, REPORT_ONLY, "failed")
    # Create the tasks first (their trigger commits are not the worker's work), then time
    # the wake-ups from the first publish to the last end, as for the raw tasks.
    rt = bench.rt
    saved = rt.dispatcher
    rt.dispatcher = RecordingDispatcher()
    rt.__dict__.pop("tasks", None)
    try:
        task_ids, alone_ids = (
            [
                rt.tasks.trigger(Trigger(task_type=kind, title=f"t{n}")).task.task_id
                for n in range(2 * count)
            ]
            for kind in (MINIMAL, REPORT_ONLY)
        )
    finally:
        rt.dispatcher = saved
        rt.__dict__.pop("tasks", None)
    floor_args = [counted["autocommits"], counted["transactions"], counted["redis_calls"]]
    path, recorded, dsn = record_on_copy(
        bench.rt.settings, pg_server, template, MINIMAL, 2 * count + REPLAY_WARMUP, bench.folder
    )
    replays = [
        [path, dsn, index, counted["redis_calls"]] for index in range(2 * count + REPLAY_WARMUP)
    ]
    _raw_burst(bench, REPLAY_WARMUP, RAW_REPLAY, replays[:REPLAY_WARMUP])  # load, prepare
    first_replays, second_replays = (
        replays[REPLAY_WARMUP : REPLAY_WARMUP + count],
        replays[REPLAY_WARMUP + count :],
    )
    raw = partial(_raw_burst, bench, count, RAW_COMMITS, [commits])
    procrastinate = partial(procrastinate_burst, procrastinate_dsn, bench.redis_url, count, commits)
    procrastinate_alone = partial(
        procrastinate_burst, procrastinate_dsn, bench.redis_url, count, alone["commits"]
    )
    procrastinate_burst(procrastinate_dsn, bench.redis_url, 20, commits)  # warm-up
    # Baselines and ours alternate, each twice, so load drift shows and averages out.
    phases = [
        ("raw", raw),
        ("procrastinate", procrastinate),
        ("statements", partial(_raw_burst, bench, count, RAW_REPLAY, first_replays)),
        ("ours", partial(_orchestrator_burst, bench, task_ids[:count])),
        ("floor", partial(_raw_burst, bench, count, RAW_FLOOR, floor_args)),
        ("ours", partial(_orchestrator_burst, bench, task_ids[count:])),
        ("statements", partial(_raw_burst, bench, count, RAW_REPLAY, second_replays)),
        ("procrastinate", procrastinate),
        ("raw", raw),
        # The orchestration alone (a round that only reports) against Procrastinate jobs
        # making as many commits as it does: the queue layers side by side.
        ("procrastinate-alone", procrastinate_alone),
        ("alone", partial(_orchestrator_burst, bench, alone_ids[:count], "failed")),
        ("alone", partial(_orchestrator_burst, bench, alone_ids[count:], "failed")),
        ("procrastinate-alone", procrastinate_alone),
    ]
    roles = {proc.process.pid: proc.name for proc in bench.procs.started}
    seconds: dict[str, list[float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    for kind, run in phases:
        before = cpu_seconds(roles, SERVER_PIDS)
        seconds.setdefault(kind, []).append(run())
        used = cpu_used(before, cpu_seconds(roles, SERVER_PIDS))
        totals = cpu.setdefault(kind, {})
        for role, value in used.items():
            totals[role] = totals.get(role, 0.0) + value
    check_replayed(recorded, dsn)
    bench.figures["throughput"] = {
        **{key: counted[key] for key in COUNTED},
        "n": count,
        "inprocess": counted["inprocess_ms"],
        "inprocess_cpu": counted["inprocess_cpu_ms"],
        "seconds": seconds,
        "cpu": cpu,  # per kind, summed over its bursts
        "alone": {key: alone[key] for key in ("commits", "statements", "redis_calls")},
    }


def _raw_burst(bench: Any, count: int, task: str, args: list[Any]) -> float:
    """`count` raw Celery tasks, each given `args`, or `args[i]` when that is a list of
    argument lists (one per task); seconds from the first publish to the last end."""
    each = args if args and all(isinstance(one, list) for one in args) else [args] * count
    assert len(each) == count, (len(each), count)
    bench.redis.delete(RAW_DONE_KEY)
    first = time.time()
    for one in each:
        bench.raw.send_task(task, args=one, queue=RAW_QUEUE)
    ends = []
    for _ in range(count):
        popped = bench.redis.blpop([RAW_DONE_KEY], timeout=60)
        if popped is None:
            raise RuntimeError("raw Celery tasks did not finish within 60 s")
        ends.append(float(popped[1]))
    return max(ends) - first


def _orchestrator_burst(bench: Any, task_ids: list[str], status: str = "completed") -> float:
    first = time.time()
    for task_id in task_ids:
        bench.rt.dispatcher.dispatch(task_id, 1)

    def all_done() -> bool:
        row = bench.pg.execute(
            "SELECT count(*) FROM tasks WHERE task_id = ANY(%s) AND status = %s",
            (task_ids, status),
        ).fetchone()
        return bool(row and row[0] == len(task_ids))

    # The time is read from `ended_at`, not from when this poll notices: a slow poll
    # keeps its count queries from charging Postgres CPU to the burst it measures.
    wait_for(all_done, 120, what="the burst of minimal rounds", interval=0.25)
    row = bench.pg.execute(
        "SELECT max(ended_at) FROM executions WHERE task_id = ANY(%s)", (task_ids,)
    ).fetchone()
    return float(row[0].timestamp() - first)
