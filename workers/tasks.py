"""Thin Celery tasks: take ids, call a service. One runtime per worker process."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery.signals import worker_init, worker_ready, worker_shutting_down

from orchestrator.agent.model import check_model_setting
from orchestrator.logs import log_context
from orchestrator.metrics import EXECUTIONS_ENDED, WORKER_READY, WORKER_SLOTS_BUSY
from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.cleanup import run_cleanup
from orchestrator.settings import SettingsError, get_settings
from orchestrator.tools.source_declarations import DataSourceError, load_sources
from orchestrator.tools.toolsets import SpecError, check_gateway
from workers import shutdown
from workers.celery_app import CeleryDispatcher, app
from workers.constants import CLEANUP, RUN_GENERATION, SENT_AGAIN, SWEEP

__all__ = ["GenerationFailed", "cleanup", "first_delivery", "run_generation", "sweep"]

log = logging.getLogger(__name__)

#: How many renewal periods a wake-up waits for a superseded generation to let go of the lease;
#: after that the sweeper's republishing of stale queued tasks takes over.
MAX_LEASE_WAITS = 5

_runtime: tuple[int, Runtime] | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The runtime of this process, shared by its pool threads; rebuilt after a fork so no
    connection crosses processes."""
    global _runtime
    current = _runtime
    if current is not None and current[0] == os.getpid():
        return current[1]
    with _runtime_lock:
        if _runtime is None or _runtime[0] != os.getpid():
            built = build_runtime(get_settings(), dispatcher=CeleryDispatcher(app))
            _runtime = (os.getpid(), built)
        return _runtime[1]


class GenerationFailed(Exception):
    """The generation ended `failed`: Celery records the task as FAILURE, not SUCCESS.

    Listed in the task's `throws`, so the worker logs it as one line without a traceback.
    """


def first_delivery(request: Any) -> bool:
    """Whether a wake-up is its generation's first, delivered once: not a retry of an earlier
    one, not handed out again by the broker (Kombu marks a message it restores `redelivered`:
    a worker lost, a connection dropped before the acknowledgement), not sent again by the
    sweeper (its header). Only such a wake-up cannot find its generation claimed by another,
    and takes the lease before it reads the store."""
    if request.retries:
        return False
    if (request.delivery_info or {}).get("redelivered"):
        return False
    sent = request.headers or {}
    return not (sent.get("redelivered") or sent.get(SENT_AGAIN))


@app.task(name=RUN_GENERATION, bind=True, throws=(GenerationFailed,))
def run_generation(self: Any, task_id: str, generation: int) -> str:
    worker = f"{self.request.hostname or socket.gethostname()}:{os.getpid()}"
    with (
        log_context(task_id=task_id, generation=generation, worker=worker),
        shutdown.round_in_flight(),
        WORKER_SLOTS_BUSY.track_inprogress(),
    ):
        result = runtime().executions.run(
            task_id,
            generation,
            worker=worker,
            celery_task_id=self.request.id,
            first_delivery=first_delivery(self.request),
        )
        log.info("task %s generation %s: %s", task_id, generation, result.detail)
    if result.ran:
        EXECUTIONS_ENDED.labels(result.outcome or "stopped").inc()
    if result.retry_after is not None and self.request.retries < MAX_LEASE_WAITS:
        # The first wait is short: the holder may be a late duplicate wake-up that gives the
        # lease back at once; after that, one renewal period for a superseded holder to stop.
        countdown = (
            min(1.0, result.retry_after) if self.request.retries == 0 else result.retry_after
        )
        raise self.retry(countdown=countdown, max_retries=MAX_LEASE_WAITS)
    if result.outcome == "failed":
        # Celery's view (Flower's counts) must match the store's: a failed generation fails.
        raise GenerationFailed(f"task {task_id} generation {generation} failed: {result.detail}")
    return result.detail


@app.task(name=SWEEP)
def sweep() -> list[str]:
    lines = runtime().sweeper.sweep().lines()
    for line in lines:
        log.info("%s", line)
    return lines


@app.task(name=CLEANUP)
def cleanup() -> dict[str, Any]:
    """The periodic retention pass; the same service as `orchestrator cleanup`."""
    current = runtime()
    report = run_cleanup(current.db, current.settings).to_dict()
    log.info("cleanup: %s", report)
    return report


@worker_init.connect
def _hand_back_at_exit(**_: Any) -> None:
    """A cold shutdown stops the running rounds and hands them back (workers/shutdown.py)."""
    shutdown.install()


@worker_shutting_down.connect
def _say_what_a_warm_shutdown_waits_for(how: str = "", **_: Any) -> None:
    WORKER_READY.set(0)  # it takes no more wake-ups (a warm shutdown lets its rounds run on)
    if how == "Warm":
        shutdown.announce_warm_shutdown()


@worker_init.connect
def _check_gateway(**_: Any) -> None:
    """A gateway spec that cannot be loaded stops the worker at start, with one line."""
    try:
        check_gateway(get_settings())
    except SpecError as exc:
        log.critical("%s", exc.message)
        raise SystemExit(2) from None
    try:
        settings = get_settings()
        load_sources(settings.data_sources, tool_timeout_seconds=settings.tool_timeout_seconds)
    except DataSourceError as exc:
        log.critical("%s", exc)
        raise SystemExit(2) from None


@worker_init.connect
def _check_store(**_: Any) -> None:
    """A store that does not answer or is not migrated stops the worker at start, with one line:
    `orchestrator worker` checks it before Celery starts, `celery -A workers.celery_app worker`
    here (else a traceback at `worker_ready`, and a worker that takes wake-ups it cannot run)."""
    # Imported here: the CLI's wording of store errors, without the CLI at every worker import.
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.cli.common import CommandFailed
    from orchestrator.cli.db import check_store_ready
    from orchestrator.cli.store_errors import describe_store_error

    try:
        check_store_ready(get_settings().store_url)
    except CommandFailed as exc:
        log.critical("%s", exc)
        raise SystemExit(exc.exit_code) from None
    except SQLAlchemyError as exc:
        log.critical("%s", describe_store_error(exc))
        raise SystemExit(1) from None


@worker_init.connect
def _check_model(**_: Any) -> None:
    """No silent default: a worker without a usable `ORCH_MODEL` stops at start, with one line."""
    try:
        check_model_setting(get_settings())
    except SettingsError as exc:
        log.critical("%s", exc)
        raise SystemExit(2) from None


@worker_ready.connect
def _cold_start(**_: Any) -> None:
    # First the generations of this host's processes that are gone (a worker killed and
    # restarted, under any name): requeued now, not when their leases run out.
    for line in runtime().sweeper.recover_gone_processes().lines():
        log.warning("restart recovery: %s", line)
    marked = runtime().cold_start()
    if marked:
        log.warning("cold start: %d running receipt(s) of dead generations are now unknown", marked)


@worker_ready.connect
def _ready(**_: Any) -> None:
    """`orchestrator_worker_ready` 1: Celery consumes wake-ups (after the restart recovery
    above, a receiver connected before this one)."""
    WORKER_READY.set(1)
