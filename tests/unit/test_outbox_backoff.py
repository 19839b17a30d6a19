"""The outbox loop backs off while its rounds fail (the store away): it neither spins nor logs
every poll interval, and goes back to its poll interval once a round succeeds."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.services.outbox import DispatchReport, OutboxDispatcher
from orchestrator.settings import load_settings


class _Recorded(threading.Event):
    """A stop event that records each wait and sets itself after `limit` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


class _Flaky(OutboxDispatcher):
    def __init__(self, outcomes: list[bool], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outcomes = outcomes

    def run_once(self, stop: threading.Event | None = None) -> DispatchReport:
        if self.outcomes and not self.outcomes.pop(0):
            raise ConnectionError("the store is away")
        return DispatchReport()


def test_failed_rounds_back_off_to_a_bound_then_the_poll_interval_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(home=tmp_path / "home", outbox_poll_seconds=1.0)
    dispatcher = _Flaky([False] * 8 + [True, True], settings=settings, db=None)  # type: ignore[arg-type]
    stop = _Recorded(limit=10)
    with caplog.at_level(logging.INFO, logger="orchestrator.services.outbox"):
        dispatcher.run(stop)
    dispatcher.close()
    assert stop.waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0, 1.0, 1.0]
    failed = [r for r in caplog.records if "outbox round failed" in r.getMessage()]
    assert len(failed) == 8
    assert "retrying in 30 s" in failed[-1].getMessage()
    assert any("succeeded again after 8 failure(s)" in r.getMessage() for r in caplog.records)


def test_a_long_outage_keeps_the_loop_alive_at_the_bound(tmp_path: Path) -> None:
    """Thirty-second rounds for nine hours are about 1,100 failures in a row: the wait stays
    at the bound (a doubling computed without a bound overflows a float after 1,023)."""
    settings = load_settings(home=tmp_path / "home", outbox_poll_seconds=1.0)
    dispatcher = _Flaky([False] * 1100, settings=settings, db=None)  # type: ignore[arg-type]
    stop = _Recorded(limit=1100)
    dispatcher.run(stop)
    dispatcher.close()
    assert len(stop.waits) == 1100
    assert set(stop.waits[5:]) == {30.0}
