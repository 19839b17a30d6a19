"""Every requeue of a lost generation is counted once, with its delay since the lease expired.

Real Postgres and Redis; the figures are read from a scrape of the process's metrics, as a
Prometheus server would, before and after. The counters are process-wide, so each test compares
the two scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import metrics
from orchestrator.runtime import Runtime
from orchestrator.services.sweeper import LEASE_EXPIRED, SweepReport
from orchestrator.services.tasks import Trigger
from tests.executions_support import claim_as_worker, runtime_for, sweep_at_once
from tests.integration.test_gone_processes import claim, exited_process

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

TTL, COUNT = 0.5, 12


@dataclass(frozen=True)
class Scrape:
    recoveries: float
    delays: int  # observations of orchestrator_recovery_delay_seconds
    delay_sum: float
    within_1s: int  # observations in the le="1.0" bucket

    @classmethod
    def now(cls) -> Scrape:
        samples = {
            (s.name, s.labels.get("le")): s.value
            for family in text_string_to_metric_families(metrics.render(None).decode())
            for s in family.samples
        }
        name = "orchestrator_recovery_delay_seconds"
        return cls(
            recoveries=samples[("orchestrator_recoveries_total", None)],
            delays=int(samples[(f"{name}_count", None)]),
            delay_sum=samples[(f"{name}_sum", None)],
            within_1s=int(samples[(f"{name}_bucket", "1.0")]),
        )

    def since(self, before: Scrape) -> Scrape:
        return Scrape(
            self.recoveries - before.recoveries,
            self.delays - before.delays,
            self.delay_sum - before.delay_sum,
            self.within_1s - before.within_1s,
        )


def new_runtime(pg_url: str, redis_url: str, tmp_path: Path) -> Runtime:
    runtime, _ = runtime_for(pg_url, tmp_path, redis_url=redis_url, max_recoveries=3)
    return runtime


@pytest.fixture
def rt(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime = new_runtime(pg_url, redis_url, tmp_path)
    yield runtime
    runtime.close()


def expire(rt: Runtime, count: int) -> tuple[list[str], float]:
    """`count` generations claimed and abandoned, their leases expired: their task ids, and how
    many seconds ago the first lease was taken."""
    began = time.monotonic()
    task_ids = []
    for n in range(count):
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title=f"t{n}")).task.task_id
        claim_as_worker(rt, task_id, 1, "doomed-worker", TTL)
        task_ids.append(task_id)
    time.sleep(TTL + 0.3)
    return task_ids, time.monotonic() - began


def test_a_batched_sweep_counts_each_requeue_once_with_its_delay(rt: Runtime) -> None:
    before = Scrape.now()
    task_ids, span = expire(rt, COUNT)
    began = time.monotonic()
    report = rt.sweeper.sweep()
    span += time.monotonic() - began
    assert sorted(report.requeued) == sorted((t, 1, 2) for t in task_ids)
    seen = Scrape.now().since(before)
    assert seen.recoveries == COUNT
    assert seen.delays == COUNT
    # Each lease expired at least 0.3 s before the sweep, and less than the whole test ago.
    assert COUNT * 0.25 <= seen.delay_sum <= COUNT * (span - TTL), seen
    if span - TTL < 1:  # every delay is below 1 s: all in the first bucket
        assert seen.within_1s == COUNT, seen
    assert rt.sweeper.sweep().requeued == []
    assert Scrape.now().since(before).delays == COUNT  # nothing counted twice


def test_a_requeue_another_sweeper_won_is_not_counted(
    rt: Runtime, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    task_ids, _ = expire(rt, COUNT)
    before = Scrape.now()
    rt.sweeper.sweep()
    # A second sweeper that read the same expiries before the first one committed.
    other = new_runtime(pg_url, redis_url, tmp_path)
    try:
        late = SweepReport()
        other.sweeper.requeue_lost([(t, 1) for t in task_ids], LEASE_EXPIRED, late)
    finally:
        other.close()
    assert late.requeued == []
    seen = Scrape.now().since(before)
    assert (seen.recoveries, seen.delays) == (COUNT, COUNT)


def test_two_sweepers_racing_count_each_expiry_once(
    rt: Runtime, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    other = new_runtime(pg_url, redis_url, tmp_path)
    try:
        task_ids, span = expire(rt, COUNT)
        before = Scrape.now()
        reports = sweep_at_once(rt, other)
        span += 1.0  # the sweeps' own time, generously
    finally:
        other.close()
    assert len(reports) == 2
    requeued = [entry for report in reports for entry in report.requeued]
    assert sorted(requeued) == sorted((t, 1, 2) for t in task_ids)
    seen = Scrape.now().since(before)
    assert (seen.recoveries, seen.delays) == (COUNT, COUNT)
    assert COUNT * 0.25 <= seen.delay_sum <= COUNT * span, seen


def test_the_restart_recovery_of_a_gone_process_is_counted_with_no_delay(rt: Runtime) -> None:
    gone = [claim(rt, exited_process())[0] for _ in range(3)]
    before = Scrape.now()
    report = rt.sweeper.recover_gone_processes()
    assert sorted(report.requeued) == sorted((t, 1, 2) for t in gone)
    seen = Scrape.now().since(before)
    # Found long before its lease would run out: requeued with no delay since an expiry.
    assert (seen.recoveries, seen.delays, seen.delay_sum) == (3, 3, 0.0)
    assert rt.sweeper.recover_gone_processes().requeued == []
    assert Scrape.now().since(before).delays == 3
