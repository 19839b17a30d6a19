"""One heartbeat per process under load: many leases renewed in time, a refusal stops only its own.

Real Redis leases and a real Postgres store; 50 generations claimed in one process, each kept
by a `LeaseKeeper`, all renewed by the process's single heartbeat thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services.lease_keeper import LeaseKeeper, heartbeat
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.executions_support import claim_as_worker, runtime_for

TTL, EVERY, COUNT = 2.0, 0.4, 50

pytestmark = [pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture
def rt(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, tmp_path, redis_url=redis_url)
    yield runtime
    runtime.close()


def keepers(rt: Runtime, count: int) -> list[LeaseKeeper]:
    made = []
    for n in range(count):
        task_id = rt.tasks.trigger(Trigger(task_type="simple", title=f"t{n}")).task.task_id
        token = claim_as_worker(rt, task_id, 1, "load-test", TTL)
        keeper = LeaseKeeper(
            rt.leases, rt.db, Fence(task_id, 1, token), holder="w", ttl=TTL, renew_every=EVERY
        )
        keeper.start()
        made.append(keeper)
    return made


def test_one_heartbeat_renews_every_lease_in_time_and_a_refusal_stops_only_its_own(
    rt: Runtime,
) -> None:
    before = heartbeat().held()  # keepers another test may have left running
    held = keepers(rt, COUNT)
    started = time.monotonic()  # every keeper claimed and renewing by now
    try:
        beats = [t for t in threading.enumerate() if t.name == "lease-heartbeat"]
        assert len(beats) == 1  # not a thread per generation
        assert heartbeat().held() == before + COUNT
        time.sleep(TTL / 2)
        # Two leases taken over (their keys now hold someone else's token), one cancelled.
        stolen = held[:2]
        for keeper in stolen:
            assert rt.leases.release(keeper.name, keeper.fence.lease_token)
            assert rt.leases.acquire(keeper.name, "thief", 30) is not None
        cancelled = held[2]
        rt.tasks.cancel(cancelled.fence.task_id)
        time.sleep(TTL * 1.5)  # well past the TTL: only the heartbeat keeps the others alive
        # Each refused one stops by its lease's end at the latest (a stolen lease may be a
        # wake-up of its own generation after Redis lost its data, until then); on a loaded
        # machine a beat comes later, so each is given until then again before it counts as
        # kept running.
        deadline = time.monotonic() + TTL * 2
        while time.monotonic() < deadline and not all(
            k.lost.is_set() for k in [*stolen, cancelled]
        ):
            time.sleep(0.05)
        watched = time.monotonic() - started
        for keeper in [*stolen, cancelled]:
            assert keeper.lost.is_set()
        survivors = held[3:]
        assert not [k.fence.task_id for k in survivors if k.lost.is_set()]
        for keeper in survivors:
            keeper.check()
            # Renewed in time: never a gap that reached the lease minus its safety margin (a
            # loaded machine may hold one beat back for most of a second: the lease is what
            # must not run out).
            assert keeper.longest_gap < TTL - keeper.margin, keeper.longest_gap
            # And on its period, not only as the lease nears its end: a heartbeat that renewed
            # each lease once per lease would make about a third of these.
            assert keeper.renewals >= watched / EVERY / 2, (keeper.renewals, watched)
            info = rt.leases.get(keeper.name)
            assert info is not None
            assert info.token == keeper.fence.lease_token
        with rt.db.transaction(readonly=True) as conn:
            mirror = execution_store.get_execution(conn, survivors[0].fence.task_id, 1)
        assert mirror is not None
        assert mirror.lease_expires_at is not None
    finally:
        for keeper in held:
            keeper.close()
    assert heartbeat().held() <= before
    assert all(rt.leases.get(task_lease(k.fence.task_id)) is None for k in held[2:])
