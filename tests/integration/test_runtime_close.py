"""A closed runtime leaves nothing running against its store: a hand-back the store refused
(`services/handback.py`) stopped being tried when the runtime closed. Before, its retry thread
went on trying, every second, for up to a lease after `Runtime.close()`, against a store the
process had closed. What it had not handed back is left to its mirrored lease, which the
sweeper requeues once it runs out, as for a worker that died. Both stores."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.domain.fences import Fence
from orchestrator.services import handback as handback_module
from tests.executions_support import claim_as_worker, runtime_for, simple_task, wait_for


def _handback_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "handback"]


def test_closing_a_runtime_stops_its_hand_back_retries_and_loses_nothing(
    store_url: str, scripts: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # A lease of 3 s: the retries would have gone on for 3 s after the hand-back.
    rt, _ = runtime_for(store_url, scripts, lease_seconds=3, lease_renew_seconds=1)
    task_id = simple_task(rt, scripts)
    token = claim_as_worker(rt, task_id, 1, "w1", ttl=3)
    rt.leases.release(f"task:{task_id}", token)  # the round stopped; its store write did not
    monkeypatch.setattr(handback_module, "RETRY_SECONDS", 0.05)
    tries: list[float] = []

    def store_away(*_args: Any, **_kwargs: Any) -> bool:
        tries.append(time.monotonic())
        raise OperationalError("UPDATE executions", {}, Exception("server closed the connection"))

    monkeypatch.setattr(handback_module.generation_store, "hand_back", store_away)
    assert not rt.executions.handback.give_back(Fence(task_id, 1, token))
    wait_for(lambda: len(tries) >= 3, 5, 0.02, what="the hand-back's retries")
    assert _handback_threads()

    closing = time.time()
    began = time.monotonic()
    rt.close()
    assert time.monotonic() - began < 1.0  # promptly
    closed = time.time()
    assert not _handback_threads()
    tried = len(tries)
    time.sleep(0.3)  # six retry periods
    assert len(tries) == tried, "the hand-back was tried again after close"
    after = [r for r in caplog.records if r.created >= closing]
    assert not [r for r in after if r.exc_info or r.levelno >= logging.WARNING], after
    left = f"generation 1 of {task_id}: left to its lease, which the sweeper requeues"
    assert [r.getMessage() for r in after].count(left) == 1
    assert not [r for r in after if r.name == handback_module.__name__ and r.created > closed]
    # Once closed, a hand-back is not tried at all.
    assert not rt.executions.handback.give_back(Fence(task_id, 1, token))
    assert len(tries) == tried

    # Nothing lost: the generation is requeued once its mirrored lease runs out.
    monkeypatch.undo()
    other, _ = runtime_for(store_url, scripts, lease_seconds=3, lease_renew_seconds=1)
    try:

        def requeued() -> bool:
            other.sweeper.sweep()
            task = other.tasks.get(task_id)
            return (task.generation, task.status) == (2, "queued")

        wait_for(requeued, 10, 0.2, what="the sweeper to requeue generation 2")
    finally:
        other.close()
