"""Every Redis key the orchestrator uses, in one place, all under the `orch:` prefix.

One module keeps the key space reviewable (what can collide, what `SCAN orch:*` returns) and lets
a shared Redis host several things without guessing at names spread through the code.
"""

from __future__ import annotations

__all__ = [
    "ENDED_CHANNEL_PREFIX",
    "LEASE_PREFIX",
    "PLAN_CHANNEL_PREFIX",
    "PREFIX",
    "SIGN_IN_PREFIX",
    "ended_key",
    "lease_key",
    "lease_name",
    "sign_in_key",
    "task_lease",
]

PREFIX = "orch:"

#: One string key per lease: `orch:lease:<name>`, value `token|acquired_ms|renewed_ms|holder`.
LEASE_PREFIX = f"{PREFIX}lease:"

#: Pub/sub channel of a session's plan wake-ups: `orch:plans:<session_id>`, message the revision.
PLAN_CHANNEL_PREFIX = f"{PREFIX}plans:"

#: What a commit that ends a task's live generation from outside announces (a cancel, an
#: operator requeue, a sweep): the wake-up key `ended:<task_id>`, published on the channel
#: `orch:plans:ended:<task_id>`; the worker running that generation listens for it.
ENDED_CHANNEL_PREFIX = f"{PLAN_CHANNEL_PREFIX}ended:"

#: One string key per bucket of wrong tokens (`orchestrator.api.shared_sign_ins`): a client
#: address, an IPv6 /64 or /48: `orch:sign-in:<bucket>`, value `level at_ms`, expiring when
#: its level would have drained to nothing.
SIGN_IN_PREFIX = f"{PREFIX}sign-in:"


def ended_key(task_id: str) -> str:
    """The wake-up key of "the live generation of `task_id` was ended elsewhere"."""
    return f"ended:{task_id}"


def task_lease(task_id: str) -> str:
    """The name of the lease that the live generation of `task_id` holds."""
    return f"task:{task_id}"


def lease_key(name: str) -> str:
    """The Redis key of the lease called `name`."""
    return f"{LEASE_PREFIX}{name}"


def lease_name(key: str | bytes) -> str:
    """The lease name back from its key (for scans)."""
    text = key.decode() if isinstance(key, bytes) else key
    if not text.startswith(LEASE_PREFIX):
        raise ValueError(f"not a lease key: {text!r}")
    return text[len(LEASE_PREFIX) :]


def sign_in_key(bucket: str) -> str:
    """The Redis key of the bucket of wrong tokens called `bucket` (an address, a network)."""
    return f"{SIGN_IN_PREFIX}{bucket}"
