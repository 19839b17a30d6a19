"""Leases: who runs a task's generation right now. Redis when configured, else the SQL store."""

from __future__ import annotations

from orchestrator.leases.base import LeaseBackend, LeaseBackendUnavailable, LeaseInfo, Renewal
from orchestrator.settings import Settings
from orchestrator.store.db import Database

__all__ = ["LeaseBackend", "LeaseBackendUnavailable", "LeaseInfo", "Renewal", "make_lease_backend"]


def make_lease_backend(settings: Settings, database: Database) -> LeaseBackend:
    """Redis leases when `settings.redis_url` is set; otherwise leases in `database`."""
    # Imported here so the embedded mode never imports redis-py and vice versa.
    if settings.redis_url:
        from orchestrator.leases.redis import RedisLeaseBackend

        return RedisLeaseBackend.from_url(settings.redis_url)
    from orchestrator.leases.sql import SqlLeaseBackend

    return SqlLeaseBackend(database)
