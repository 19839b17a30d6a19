"""The sweeper says when Redis stops answering it, once an outage, and when it answers again.

Before, a sweep with Redis down was silent unless it had something to send: the broker mark it
keeps every sweep failed without a word, so an idle fleet's sweeper said nothing for the whole
outage; with an unsent wake-up or an expired lease it said it again at every sweep (the
dispatcher's line, the deferred expiries' line), and nothing when Redis came back.

A real Postgres and a real redis-server of the test's own, stopped and started on its port; the
sweeper is the service, swept by hand (no loop, no sleeps), with the production lease back end
and Celery dispatcher.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from orchestrator import metrics
from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store.types import utcnow
from tests.executions_support import claim_as_worker, settings_for
from tests.services import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def rt(pg_url: str, tmp_path: Path, redis_of_its_own: RedisServer) -> Iterator[Runtime]:
    settings = settings_for(
        pg_url, tmp_path, redis_url=redis_of_its_own.url, queued_stale_seconds=60
    )
    runtime = build_runtime(settings)
    yield runtime
    runtime.close()


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The sweeper's and the dispatcher's lines at WARNING and above, and the sweeper's INFO
    about Redis; cleared for the next sweep."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("orchestrator.services")
        and (r.levelno >= logging.WARNING or "Redis" in r.getMessage())
        and "mark in Redis was missing" not in r.getMessage()  # a new Redis: said as before
    ]
    caplog.clear()
    return lines


def unreachable_seconds() -> float:
    return float(metrics.sweeper_redis_unreachable().collect()[0].samples[0].value)


def test_one_line_an_outage_and_one_when_redis_answers_again(
    rt: Runtime, redis_of_its_own: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orchestrator")
    rt.sweeper.sweep()
    assert said(caplog) == []
    assert unreachable_seconds() == 0.0

    # A generation claimed with its lease in Redis, then Redis goes away.
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="held")).task.task_id
    claim_as_worker(rt, task_id, 1, "w1", 60)
    redis_of_its_own.stop()
    quiet = rt.tasks.trigger(Trigger(task_type="simple", title="unsent")).task.task_id
    caplog.clear()  # the trigger's own refusal (its caller says it)

    later = utcnow() + timedelta(minutes=5)  # the claimed generation's lease ran out by then
    first = rt.sweeper.sweep(later)
    assert (first.deferred, first.unsent) == (1, [(quiet, 1)])
    # From the outage's first sweep: the time since its first failed attempt (it read 0).
    assert unreachable_seconds() > 0.0
    [line] = said(caplog)
    assert line.startswith(f"Redis at 127.0.0.1:{redis_of_its_own.port} does not answer (")
    assert "Connection refused" in line  # why
    # What it could not do, and that it goes on.
    assert "1 expired generation(s) not checked" in line
    assert "1 wake-up(s) not sent (recorded in the store" in line
    assert line.endswith(
        "the sweeper tries again at every sweep (every 1s) and says when Redis answers again"
    )
    for _ in range(3):  # the same outage: nothing more
        rt.sweeper.sweep(later)
        assert said(caplog) == []
    assert unreachable_seconds() > 0.0

    redis_of_its_own.start()  # on its port, empty
    back = rt.sweeper.sweep(later)
    assert (quiet, 1) in back.republished
    assert [t for t, _, _ in back.requeued] == [task_id]
    [line] = said(caplog)
    assert line.startswith(f"Redis at 127.0.0.1:{redis_of_its_own.port} answers again after ")
    assert line.endswith(
        "s: expired leases are checked and the recorded wake-ups sent from this sweep on"
    )
    assert unreachable_seconds() == 0.0
    rt.sweeper.sweep(later)
    assert said(caplog) == []

    # Another outage is another line, also when the sweep has nothing to send (an idle fleet).
    redis_of_its_own.stop()
    rt.sweeper.sweep()
    [line] = said(caplog)
    assert "does not answer" in line
    assert "its mark (to notice Redis losing its data) not kept" in line


@pytest.mark.parametrize("refusal", ["out_of_memory", "credentials"])
def test_redis_that_answers_but_refuses_is_said_as_such_once_and_is_no_outage(
    rt: Runtime, redis_of_its_own: RedisServer, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    """Every wake-up the broker did not take was said as `Redis ... does not answer`, and the
    outage gauge counted it, though Redis answered: a full server (OOM, noeviction) or one
    that no longer takes the sweeper's password is not mended by waiting for it to come back.
    It is said as what it is, once, Redis still counts as answering, and one line says when
    Redis takes the sweeper's commands again."""
    caplog.set_level(logging.INFO, logger="orchestrator")
    rt.sweeper.sweep()
    admin = redis.Redis.from_url(redis_of_its_own.url)
    if refusal == "out_of_memory":
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
    else:  # the sweeper's connections authenticated as default: a new password refuses them
        admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">another-secret")
        admin = redis.Redis.from_url(redis_of_its_own.url, password="another-secret")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="refused")).task.task_id
    caplog.clear()  # the trigger's own refusal (its caller says it)

    first = rt.sweeper.sweep()
    assert first.unsent == [(task_id, 1)]
    [line] = said(caplog)
    assert "does not answer" not in line, line
    where = f"Redis at 127.0.0.1:{redis_of_its_own.port}"
    if refusal == "out_of_memory":
        assert line.startswith(f"{where} answers but refused a command (OutOfMemoryError: "), line
    else:
        assert line.startswith(
            f"{where} answers but refuses the sweeper's credentials (AuthenticationError: "
        ), line
        assert "another-secret" not in line
    assert "1 wake-up(s) not sent (recorded in the store" in line
    assert unreachable_seconds() == 0.0  # Redis answers: no outage to page on
    for _ in range(2):  # the same refusal: nothing more
        rt.sweeper.sweep()
        assert said(caplog) == []
    assert unreachable_seconds() == 0.0

    if refusal == "out_of_memory":
        admin.config_set("maxmemory", "0")
    else:
        admin.execute_command("ACL", "SETUSER", "default", "nopass")
    back = rt.sweeper.sweep()
    assert (task_id, 1) in back.republished
    [line] = said(caplog)
    assert line.startswith(f"{where} takes the sweeper's commands again"), line
    admin.close()
