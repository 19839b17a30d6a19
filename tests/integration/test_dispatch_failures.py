"""A broker that does not take a wake-up is one warning line, never a traceback: the sweeper
republishes the wake-up later, so the failure is expected and said, not a crash."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.services.dispatch import safe_dispatch, safe_dispatch_many
from orchestrator.settings import load_settings
from tests.services import RedisServer, ServiceMissing, service_unavailable
from workers.celery_app import CeleryDispatcher, make_celery


@pytest.fixture
def dispatcher_without_redis(tmp_path: Path) -> CeleryDispatcher:
    """A dispatcher on a Redis that was started and is now gone (nothing listens on its port)."""
    server = RedisServer()
    try:
        server.start()
    except ServiceMissing as exc:
        service_unavailable(str(exc))
    settings = load_settings(redis_url=server.url, home=tmp_path / "home")
    server.close()
    return CeleryDispatcher(make_celery(settings))


@pytest.mark.parametrize("how", ["one", "batch"])
def test_a_wake_up_the_broker_refused_is_one_line_without_a_traceback(
    dispatcher_without_redis: CeleryDispatcher, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.WARNING, logger="orchestrator.services.dispatch")
    if how == "one":
        assert safe_dispatch(dispatcher_without_redis, "t1", 1) is False
    else:
        sent = safe_dispatch_many(dispatcher_without_redis, [("t1", 1), ("t2", 1)])
        assert sent == [False, False]
    [record] = [r for r in caplog.records if r.name == "orchestrator.services.dispatch"]
    # Before, a batch (a sweep's requeues) logged its failure with a traceback.
    assert record.exc_info is None
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "the sweeper republishes" in message
    assert "OperationalError" in message or "ConnectionError" in message, message
    assert "\n" not in message
