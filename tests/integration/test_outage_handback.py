"""A round a Postgres outage stopped, longer than its lease, still counts as an outage.

The worker releases its lease and hands the generation back once the store answers (tried every
second). The outage outlasted the lease mirrored in the store, so the first sweep once the store
is back found an expired lease with no holder and took it for a worker that died: counted in
`recoveries`, and three such outages in a row parked the task as `recovery_limit`, which the
hand-back exists to prevent. The sweeper, having met the outage itself, now leaves expired
leases to their workers' hand-backs for a few seconds first.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.services.tasks import Trigger
from orchestrator.store.types import utcnow
from tests.executions_support import claim_as_worker, runtime_for, wait_for
from tests.services import PostgresServer

LEASE = 0.5


def test_a_round_handed_back_after_an_outage_longer_than_its_lease_counts_as_an_outage(
    pg_url: str, redis_url: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    rt, _ = runtime_for(pg_url, tmp_path / "scripts", redis_url=redis_url)
    rt.sweeper.handback_grace = 0.5  # the default is three hand-back retries (3 s)
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="t", title="outage")).task.task_id
        token = claim_as_worker(rt, task_id, 1, "w1", LEASE)
        mirror_runs_out = utcnow() + timedelta(seconds=LEASE)
        postgres.pause()
        try:
            # The round met the store away and stopped: its lease released, as the worker does.
            assert rt.leases.release(task_lease(task_id), token)
            with pytest.raises(OperationalError):
                rt.sweeper.sweep()  # the sweeper meets the outage too
            # The outage outlasts the lease mirrored in the store.
            wait_for(lambda: utcnow() > mirror_runs_out, 5, 0.05, what="the mirror to run out")
        finally:
            postgres.resume()

        # The store is back; the worker's hand-back (tried every second) has not landed yet.
        assert rt.sweeper.sweep().requeued == []
        assert rt.executions.handback.give_back(Fence(task_id, 1, token))  # now it lands
        wait_for(lambda: bool(rt.sweeper.sweep().requeued), 10, 0.05, what="the requeue")

        task = rt.tasks.get(task_id)
        assert (task.generation, task.recoveries, task.handbacks) == (2, 0, 1)
    finally:
        rt.close()


def test_a_dead_workers_lease_is_recovered_though_the_store_fails_every_other_sweep(
    pg_url: str, redis_url: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    """Each answer after a failed sweep used to start the grace again: a store that failed
    every other sweep kept a dead worker's expired lease unrecovered for ever (invariant 8).
    One grace per expiry, however many outages follow."""
    rt, _ = runtime_for(pg_url, tmp_path / "scripts", redis_url=redis_url)
    grace = 0.5
    rt.sweeper.handback_grace = grace
    try:
        task_id = rt.tasks.trigger(Trigger(task_type="t", title="flapping")).task.task_id
        claim_as_worker(rt, task_id, 1, "w1", LEASE)  # the worker dies: nothing is handed back
        runs_out = utcnow() + timedelta(seconds=LEASE)
        wait_for(lambda: utcnow() > runs_out, 5, 0.05, what="the lease to run out")

        requeued: list[object] = []
        first_left = 0.0
        for flap in range(2):
            postgres.pause()
            try:
                with pytest.raises(OperationalError):
                    rt.sweeper.sweep()
            finally:
                postgres.resume()
            if flap == 0:
                first_left = time.monotonic()
                assert rt.sweeper.sweep().requeued == []  # in the grace: left to a hand-back
                wait_for(
                    lambda left=first_left: time.monotonic() - left >= grace,
                    5,
                    0.05,
                    what="the grace",
                )
            else:
                requeued = list(rt.sweeper.sweep().requeued)
        assert requeued, "the expired lease was left alone again after the second outage"
        task = rt.tasks.get(task_id)
        assert (task.generation, task.recoveries) == (2, 1)
    finally:
        rt.close()
