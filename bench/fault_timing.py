"""The fault campaign's clock (bench/faults.py): its fleet's lease, renewal, sweep and stale
wake-up intervals, and how long its slow backend and its stalled workers hold."""

from __future__ import annotations

__all__ = ["LEASE", "RENEW", "SLOW_WRITE_S", "STALE", "STALL_BEYOND_LEASE", "SWEEP"]

LEASE, RENEW, SWEEP, STALE = 4.0, 1.0, 1.0, 5.0
SLOW_WRITE_S = 1.0
#: A stalled worker stays stopped this long past its lease: its generations are requeued (and
#: usually started again elsewhere) while its rounds are frozen mid-way.
STALL_BEYOND_LEASE = 3.0
