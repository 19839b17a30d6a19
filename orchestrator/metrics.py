"""Prometheus metrics: every definition in one module, so each branch imports what it feeds.

Two kinds, chosen for Celery prefork (one parent, several pool processes):

- Counts of rows (tasks by status and the running ones handed back, receipts by status,
  approvals pending, dead-lettered outbox rows, the oldest deliverable pending row's age) are read
  from the store at scrape time by `StoreCollector`: every process and every replica agrees,
  nothing to merge.
- Counters and histograms of events (executions started/ended, renewals, sweeps, model and tool
  calls, ...) are kept per process. With `PROMETHEUS_MULTIPROC_DIR` set (`orchestrator worker`
  sets it when ORCH_METRICS_PORT is on; the sweeper is one process and counts in memory),
  prometheus-client keeps them in files that `MultiProcessCollector` sums at scrape time, so
  pool processes are counted. A labelled counter's known values are exported at 0 from the
  start (`KNOWN_LABELS`): an alert on `rate(...{result="failed"}[5m])` has its series before
  the first failure.
  The worker's folder and the removal of gone workers' folders: `orchestrator.metrics_folders`.

Serve with `metrics_app`'s content (the API's `GET /metrics`) or `serve_metrics(port)`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.domain.vocabulary import (
    EXECUTION_OUTCOMES,
    OUTBOX_KINDS,
    RECEIPT_STATUSES,
    TASK_STATUSES,
)
from orchestrator.store.db import Database
from orchestrator.store.executions import count_handed_back
from orchestrator.store.outbox_views import oldest_deliverable
from orchestrator.store.tables import actions, invocation_receipts, outbox, tasks
from orchestrator.store.types import utcnow

__all__ = [
    "APPROVALS_DECIDED",
    "CONTENT_TYPE_LATEST",
    "EXECUTIONS_ENDED",
    "EXECUTIONS_STARTED",
    "HANDBACKS",
    "KNOWN_LABELS",
    "LEASES_TAKEN_BACK",
    "LEASE_RENEWALS",
    "LEASE_RENEWAL_FAILURES",
    "MODEL_CALLS",
    "MODEL_LATENCY",
    "MODEL_TOKENS",
    "OUTBOX_DELIVERIES",
    "OUTBOX_FAILURES",
    "OUTBOX_THROTTLED",
    "RECOVERIES",
    "RECOVERY_DELAY",
    "SWEEPS",
    "TOOL_CALLS",
    "TOOL_TIMEOUTS",
    "VERIFICATIONS",
    "WORKER_READY",
    "WORKER_SLOTS",
    "WORKER_SLOTS_BUSY",
    "StoreCollector",
    "registry",
    "render",
    "serve_metrics",
    "sweeper_redis_unreachable",
]

log = logging.getLogger(__name__)

EXECUTIONS_STARTED = Counter(
    "orchestrator_executions_started", "Generations that started an agent on a worker"
)
EXECUTIONS_ENDED = Counter(
    "orchestrator_executions_ended", "Generations that ended, by outcome", ["outcome"]
)
LEASE_RENEWALS = Counter("orchestrator_lease_renewals", "Lease renewals that succeeded")
LEASE_RENEWAL_FAILURES = Counter(
    "orchestrator_lease_renewal_failures", "Lease renewals that failed or found the lease lost"
)
LEASES_TAKEN_BACK = Counter(
    "orchestrator_leases_taken_back",
    "Leases a generation found gone (Redis lost its data, or the lease ran out while "
    "nobody took it) and took back once the store said the generation is live",
)
RECOVERIES = Counter(
    "orchestrator_recoveries",
    "Lost generations requeued by the sweeper (lease expired, or worker process gone)",
)
HANDBACKS = Counter(
    "orchestrator_handbacks",
    "Of the recoveries, the generations their workers had handed back after an outage of the "
    "store or Redis, or because the model server was away or rate limiting past the round's "
    "retries (counted in tasks' handbacks, not their recoveries; the execution says which)",
)
RECOVERY_DELAY = Histogram(
    "orchestrator_recovery_delay_seconds",
    "Time from a lease's expiry to the sweeper's requeue",
    buckets=(1, 5, 15, 30, 60, 120, 300, 900),
)
SWEEPS = Counter("orchestrator_sweeps", "Sweeps run, by result", ["result"])
# A sweep with Redis away may have nothing to fail (no expiry, no wake-up): it counts as ok.
# The gauge of Redis not answering the sweeper is made by the first sweep with Redis
# (`sweeper_redis_unreachable`), not at import: the API and the workers import this module and
# never sweep, and exported it at 0 for ever, which a fleet-wide max or average read as "Redis
# answers".
_SWEEPER_REDIS_UNREACHABLE: Gauge | None = None
_SWEEPER_GAUGE_LOCK = threading.Lock()


def sweeper_redis_unreachable() -> Gauge:
    """`orchestrator_sweeper_redis_unreachable_seconds`, registered by its first use: only a
    process that sweeps with Redis (the sweeper, a worker running `--beat`) exports it."""
    global _SWEEPER_REDIS_UNREACHABLE
    with _SWEEPER_GAUGE_LOCK:
        if _SWEEPER_REDIS_UNREACHABLE is None:
            _SWEEPER_REDIS_UNREACHABLE = Gauge(
                "orchestrator_sweeper_redis_unreachable_seconds",
                "How long Redis (leases, broker) has not answered the sweeper, from its first "
                "failed attempt to the sweeper's last sweep; 0 when it answers (also when it "
                "answers but refuses: the sweeper's log says why)",
                multiprocess_mode="livemax",
            )
        return _SWEEPER_REDIS_UNREACHABLE


VERIFICATIONS = Counter(
    "orchestrator_verifications", "Write verifications (read-back), by result", ["result"]
)
APPROVALS_DECIDED = Counter(
    "orchestrator_approvals_decided", "Approvals decided, by decision", ["decision"]
)
OUTBOX_DELIVERIES = Counter("orchestrator_outbox_deliveries", "Outbox messages delivered")
OUTBOX_FAILURES = Counter(
    "orchestrator_outbox_failures",
    "Outbox delivery attempts that failed (a 5xx, a timeout, a refusal; not a throttling 429)",
)
# Apart from the failures: a backend rate-limiting a burst is not a backend failing, and the
# throttled attempts of a webhook do not count toward ORCH_WEBHOOK_MAX_ATTEMPTS.
OUTBOX_THROTTLED = Counter(
    "orchestrator_outbox_throttled",
    "Outbox delivery attempts the backend answered 429 Too Many Requests (retried, not counted "
    "as failures)",
)
MODEL_CALLS = Counter(
    "orchestrator_model_calls", "Model calls, by model and status", ["model", "status"]
)
MODEL_TOKENS = Counter(
    "orchestrator_model_tokens",
    "Model tokens, by model and kind (prompt, completion)",
    ["model", "kind"],
)
MODEL_LATENCY = Histogram(
    "orchestrator_model_latency_seconds",
    "Model call latency",
    ["model"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
TOOL_CALLS = Counter(
    "orchestrator_tool_calls", "Tool calls, by tool and status", ["tool", "status"]
)
TOOL_TIMEOUTS = Counter(
    "orchestrator_tool_timeouts",
    "Tool calls given up at their time limit (ORCH_TOOL_TIMEOUT_SECONDS), by tool",
    ["tool"],
)

# A worker's capacity and what of it is in use: `busy == slots` for long is a worker with no
# free slot (wake-ups wait in the queue). Summed over the live processes of a prefork worker.
# The slots are set by `orchestrator worker` before its port answers: a scrape in its first
# seconds reads its capacity, and `ready` (0/1, as Prometheus' `up`) whether it takes wake-ups.
# Registered nowhere: a worker's port shows them from its processes' files (it always counts
# in PROMETHEUS_MULTIPROC_DIR), and the API and the sweeper do not show a worker's gauges at 0,
# which an alert on `orchestrator_worker_ready == 0` would read as a worker not ready.
WORKER_SLOTS = Gauge(
    "orchestrator_worker_slots",
    "Wake-ups this worker runs at once at most (its --concurrency), from its start",
    multiprocess_mode="livesum",
    registry=None,
)
WORKER_READY = Gauge(
    "orchestrator_worker_ready",
    "1 while this worker takes wake-ups (Celery ready), 0 before and from its shutdown",
    multiprocess_mode="livemax",
    registry=None,
)
WORKER_SLOTS_BUSY = Gauge(
    "orchestrator_worker_slots_busy",
    "Wake-ups this worker runs now (a round, or a wake-up that finds nothing to run)",
    multiprocess_mode="livesum",
    registry=None,
)

#: Every value a labelled counter is known to take, exported at 0 at import. Model and tool
#: names are open sets (whatever ORCH_MODEL and the catalogue say): they appear on first use.
KNOWN_LABELS: tuple[tuple[Counter, tuple[str, ...]], ...] = (
    # A round that ran but ended with no outcome (cancelled under it, say) counts as stopped.
    (EXECUTIONS_ENDED, (*EXECUTION_OUTCOMES, "stopped")),
    (SWEEPS, ("ok", "failed")),
    (VERIFICATIONS, ("matched", "differs", "unavailable")),
    (APPROVALS_DECIDED, ("approved", "rejected")),
)
for _counter, _values in KNOWN_LABELS:
    for _value in _values:
        _counter.labels(_value)


class _Counts(NamedTuple):
    """What one scrape reads from the store."""

    tasks: dict[str, int]
    receipts: dict[str, int]
    approvals_pending: int
    dead: dict[str, int]  # dead-lettered outbox rows by kind
    oldest_pending_seconds: dict[str, float]  # by kind; 0 when nothing of it waits
    oldest_queued_seconds: float  # 0 when no task is queued
    handed_back: int  # running tasks whose generation waits, handed back, for the sweeper


class StoreCollector(Collector):
    """Counts read from the store at scrape time: the same answer from any process."""

    def __init__(
        self,
        db: Database,
        *,
        outage_tolerant: bool = False,
        delivered: tuple[str, ...] = OUTBOX_KINDS,
    ) -> None:
        self.db = db
        # The outbox kinds whose URL is set (`Settings.outbox_kinds`): a kind nobody sends has
        # no oldest-pending age, since its rows wait for a URL on purpose and would make an
        # alert on the age fire for ever.
        self.delivered = delivered
        # The /metrics port of a worker or the sweeper: a store that is down leaves its counts
        # out of the scrape instead of failing it (the API answers 503 store_unavailable).
        self.outage_tolerant = outage_tolerant

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = self._counts()
        except SQLAlchemyError as exc:
            if not self.outage_tolerant:
                raise
            # The store down must not take the process's own counters with it (failed sweeps
            # and renewals are what an outage shows): this scrape leaves the counts out, says
            # so in one log line, and answers.
            cause = getattr(exc, "orig", None) or exc
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            log.warning("metrics: the store's counts are left out of this scrape: %s", first)
            return
        family = GaugeMetricFamily("orchestrator_tasks", "Tasks by status", labels=["status"])
        for status in TASK_STATUSES:
            family.add_metric([status], int(counts.tasks.get(status, 0)))
        yield family
        family = GaugeMetricFamily(
            "orchestrator_receipts", "Write receipts by status", labels=["status"]
        )
        for status in RECEIPT_STATUSES:
            family.add_metric([status], int(counts.receipts.get(status, 0)))
        yield family
        # Queued tasks wait for a worker's free slot: the wait of the oldest says whether the
        # fleet keeps up (a burst served shows many queued tasks, none of them old).
        yield GaugeMetricFamily(
            "orchestrator_tasks_oldest_queued_seconds",
            "Time since the oldest queued task was queued (0 when none): tasks waiting for a "
            "free worker slot",
            value=counts.oldest_queued_seconds,
        )
        # `running` counts open generations, not rounds that run: one handed back (a model
        # server rate limiting or away, an outage) waits for the sweeper, maybe for minutes.
        yield GaugeMetricFamily(
            "orchestrator_tasks_handed_back",
            "Running tasks whose generation was handed back by its worker and waits for the "
            "sweeper to requeue it (a model server's Retry-After or back-off, an outage): "
            'counted in orchestrator_tasks{status="running"}, though no round runs',
            value=counts.handed_back,
        )
        yield GaugeMetricFamily(
            "orchestrator_approvals_pending",
            "Actions waiting for a human decision",
            value=counts.approvals_pending,
        )
        family = GaugeMetricFamily(
            "orchestrator_outbox_dead",
            "Outbox rows dead-lettered (out of attempts or refused for good), by kind, until an "
            "operator retries or discards them",
            labels=["kind"],
        )
        for kind in OUTBOX_KINDS:
            family.add_metric([kind], int(counts.dead.get(kind, 0)))
        yield family
        # By kind, and only for the kinds this deployment delivers: rows of a kind whose URL
        # is not set wait on purpose (ORCH_WEBHOOK_URL unset: task events are kept for a URL
        # set later), so their age would only grow and page someone for nothing.
        family = GaugeMetricFamily(
            "orchestrator_outbox_oldest_pending_seconds",
            "How long the oldest outbox row still to be delivered has waited, by kind, of those "
            "the dispatcher may send (due, or after its backoff): since it was written or, "
            "later, since an operator's retry or discard released it (a dead letter retried "
            "after days, and the events of its task it held back, count from the retry); a "
            "webhook held in order behind its task's dead letter is left out "
            "(orchestrator_outbox_dead counts that); 0 when none; no series for a kind whose "
            "URL is not set",
            labels=["kind"],
        )
        for kind in (k for k in OUTBOX_KINDS if k in self.delivered):
            family.add_metric([kind], counts.oldest_pending_seconds.get(kind, 0.0))
        yield family

    def _counts(self) -> _Counts:
        with self.db.transaction(readonly=True) as conn:
            by_status: dict[str, int] = dict(
                conn.execute(select(tasks.c.status, func.count()).group_by(tasks.c.status)).all()
            )
            receipts: dict[str, int] = dict(
                conn.execute(
                    select(invocation_receipts.c.status, func.count()).group_by(
                        invocation_receipts.c.status
                    )
                ).all()
            )
            pending = conn.execute(
                select(func.count()).where(actions.c.status == "pending_approval")
            ).scalar_one()
            queued_since = conn.execute(
                select(func.min(tasks.c.updated_at)).where(tasks.c.status == "queued")
            ).scalar_one()
            dead: dict[str, int] = dict(
                conn.execute(
                    select(outbox.c.kind, func.count())
                    .where(outbox.c.status == "dead")
                    .group_by(outbox.c.kind)
                ).all()
            )
            handed_back = count_handed_back(conn)
            # Deliverable rows only: one held behind a dead letter is not the dispatcher's or
            # the backend's delay but the dead letter's, which orchestrator_outbox_dead pages
            # on; counted here as well, it sent the on-call to a dispatcher that was fine.
            oldest = oldest_deliverable(conn)
        now = utcnow()
        ages = {kind: max(0.0, (now - at).total_seconds()) for kind, at in oldest.items()}
        queued = 0.0 if queued_since is None else max(0.0, (now - queued_since).total_seconds())
        return _Counts(by_status, receipts, int(pending), dead, ages, queued, handed_back)


def registry(
    db: Database | None,
    *,
    outage_tolerant: bool = False,
    delivered: tuple[str, ...] = OUTBOX_KINDS,
) -> CollectorRegistry:
    """What a scrape shows: this process's (or every pool process's) counters and the store
    (`delivered`: the outbox kinds whose URL is set, `Settings.outbox_kinds`)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        chosen = CollectorRegistry()
        MultiProcessCollector(chosen)  # type: ignore[no-untyped-call]
    else:
        chosen = CollectorRegistry()
        chosen.register(_Forward(REGISTRY))
    if db is not None:
        chosen.register(StoreCollector(db, outage_tolerant=outage_tolerant, delivered=delivered))
    return chosen


class _Forward(Collector):
    """The default registry's metrics inside another registry (which adds the store's)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        yield from self.source.collect()


def render(db: Database | None, delivered: tuple[str, ...] = OUTBOX_KINDS) -> bytes:
    return generate_latest(registry(db, delivered=delivered))


def serve_metrics(
    port: int, db: Database | None, delivered: tuple[str, ...] = OUTBOX_KINDS
) -> None:
    """A /metrics HTTP server on `port` (all interfaces) in a daemon thread; it answers with the
    process's counters while the store is down."""
    start_http_server(port, registry=registry(db, outage_tolerant=True, delivered=delivered))
