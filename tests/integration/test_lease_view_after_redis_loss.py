"""A running task's view after Redis lost its leases (restarted empty, flushed) or while Redis is
away: the lease the store mirrors, said to be the store's, until the worker's next renewal takes
the lease back. Before, the view showed no lease on a running task (the console: "No live
lease."), and with Redis away `tasks show` and the API's task view failed altogether."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.cli.task_show import render_explain
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from tests.executions_support import completing_turns, runtime_for, wait_for, write_script
from tests.services import RedisServer


@pytest.fixture
def rt(pg_url: str, scripts: Path, redis_of_its_own: RedisServer) -> Iterator[Runtime]:
    # Renewals far apart: the view is read between Redis's loss and the next renewal.
    runtime, _ = runtime_for(
        pg_url, scripts, redis_url=redis_of_its_own.url, lease_seconds=30, lease_renew_seconds=10
    )
    yield runtime
    runtime.close()


@pytest.mark.parametrize("how", ["flushed", "away"])
def test_a_running_task_whose_lease_redis_lost_shows_the_stores_lease(
    rt: Runtime, scripts: Path, redis_of_its_own: RedisServer, how: str
) -> None:
    write_script(scripts, "simple", completing_turns(delay_s=2.0))
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    runner = threading.Thread(target=rt.executions.run, args=(task_id, 1), kwargs={"worker": "w1"})
    runner.start()
    try:
        held = wait_for(
            lambda: (v := rt.tasks.explain(task_id))["lease"] is not None and v,
            10,
            what="the running generation's lease",
        )
        assert held["lease"]["holder"] == "w1"
        # Its first plan published: the round now works 2 s without a write (a write would
        # take the lease back at once).
        plan = wait_for(lambda: rt.plans.latest(held["session_id"]), 10, what="the first plan")
        # The publish renews the lease after its commit: a loss before that renewal was taken
        # back by it at once (seen under load). The lease back end keeps milliseconds.
        published = plan.updated_at.replace(microsecond=plan.updated_at.microsecond // 1000 * 1000)
        wait_for(
            lambda: rt.tasks.explain(task_id)["lease"]["last_renewed_at"] >= published,
            10,
            what="the publish's renewal of the lease",
        )
        if how == "flushed":
            client = redis.Redis.from_url(redis_of_its_own.url)
            client.flushall()
            client.close()
        else:
            redis_of_its_own.stop()
        view = rt.tasks.explain(task_id)  # before, with Redis away: LeaseBackendUnavailable
        assert view["status"] == "running"
        with rt.db.transaction(readonly=True) as conn:
            mirror = execution_store.get_execution(conn, task_id, 1)
        assert mirror is not None
        assert view["lease"] == {
            "holder": "w1",
            "expires_at": mirror.lease_expires_at,
            "last_renewed_at": None,
            "source": "store",
        }
        assert rt.tasks.view_version(task_id) is not None  # the API's ETag read answers too
        shown = render_explain(view)
        assert "lease not confirmed by the lease back end" in shown
        assert "store's copy: held by w1 until" in shown
    finally:
        if how == "away":
            redis_of_its_own.start()
        runner.join(timeout=30)
