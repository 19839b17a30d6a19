"""Keeps one generation's lease alive: a heartbeat thread, renewals on writes, a safety margin.

`lost` is set as soon as the generation can no longer be sure it holds its lease: a renewal was
refused, the store says the generation is over, or the last good renewal is older than the lease
minus a safety margin. The agent loop and the fenced tools stop on it.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from orchestrator.agent.loop import LeaseLost
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.types import utcnow
from orchestrator.tools.base import Fence

__all__ = ["LeaseKeeper", "lease_name"]

log = logging.getLogger(__name__)


def lease_name(task_id: str) -> str:
    return f"task:{task_id}"


class LeaseKeeper:
    """Renews `fence`'s lease every `renew_every` seconds until `close()`."""

    def __init__(
        self,
        leases: LeaseBackend,
        db: Database,
        fence: Fence,
        *,
        ttl: float,
        renew_every: float,
    ) -> None:
        self.leases = leases
        self.db = db
        self.fence = fence
        self.ttl = ttl
        self.renew_every = renew_every
        self.margin = min(5.0, ttl * 0.1)
        self.lost = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._valid_until = time.monotonic() + ttl
        self._mirrored_at = time.monotonic()  # the claim wrote the first mirror
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)

    @property
    def name(self) -> str:
        return lease_name(self.fence.task_id)

    def start(self) -> None:
        self._thread.start()

    def renew_now(self, *, mirror: bool = True) -> bool:
        """Renew the lease, and mirror its expiry in the store; False (and `lost`) on refusal.

        `mirror=False` (renewals on writes) skips the store write when the mirror is fresh: the
        sweeper asks the lease back end before it requeues, so a mirror that lags is safe.
        """
        if self.lost.is_set():
            return False
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        with self._lock:
            sent_at = time.monotonic()
            try:
                renewed = self.leases.renew(self.name, self.fence.lease_token, self.ttl)
            except LeaseBackendUnavailable:
                log.warning("lease back end unavailable while renewing %s", self.name)
                metrics.LEASE_RENEWAL_FAILURES.inc()
                self._check_overdue()
                return False
            if not renewed:
                metrics.LEASE_RENEWAL_FAILURES.inc()
                self._lose("the lease renewal was refused")
                return False
            metrics.LEASE_RENEWALS.inc()
            self._valid_until = sent_at + self.ttl
            if not mirror and sent_at - self._mirrored_at < self.renew_every / 2:
                return True
            self._mirrored_at = sent_at
            with self.db.transaction() as conn:
                still_live = task_store.mirror_lease(
                    conn,
                    self.fence.task_id,
                    self.fence.generation,
                    self.fence.lease_token,
                    utcnow() + timedelta(seconds=self.ttl),
                )
            if not still_live:
                self._lose("the store says this generation is over")
                return False
            return True

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is surely still held."""
        self._check_overdue()
        if self.lost.is_set():
            raise LeaseLost("this generation no longer holds its lease")

    def close(self) -> None:
        """Stop the heartbeat and release the lease (a no-op if someone else holds it)."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.renew_every + 5)
        try:
            self.leases.release(self.name, self.fence.lease_token)
        except LeaseBackendUnavailable:
            log.warning("could not release %s; it will expire", self.name)

    def _check_overdue(self) -> None:
        if time.monotonic() > self._valid_until - self.margin:
            self._lose("the last good renewal is older than the lease minus its safety margin")

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning(
                "generation %s of task %s stops: %s", self.fence.generation, self.fence.task_id, why
            )
            self.lost.set()

    def _beat(self) -> None:
        while not self._closed.wait(self._next_wait()):
            if self.lost.is_set():
                return
            try:
                self.renew_now()
            except Exception:
                log.exception("heartbeat of %s failed", self.name)
                self._check_overdue()

    def _next_wait(self) -> float:
        # Wake early enough to notice an overdue lease before it can expire.
        remaining = self._valid_until - self.margin - time.monotonic()
        return max(0.05, min(self.renew_every, remaining))
