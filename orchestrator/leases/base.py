"""The lease interface: one named, expiring, token-fenced lock, behind Redis or the SQL store.

A lease is held by whoever holds its token. Every call that changes a lease compares the token,
so a holder that stalled past its expiry cannot renew or release a lease someone else took over.
"""

from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum

from orchestrator.errors import OrchestratorError

__all__ = [
    "MAX_HOLDER",
    "MAX_NAME",
    "LeaseBackend",
    "LeaseBackendUnavailable",
    "LeaseInfo",
    "Renewal",
    "check_holder",
    "check_name",
    "new_token",
    "ttl_milliseconds",
]


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as the back end sees it now; every timestamp is aware UTC."""

    name: str
    holder: str
    token: str
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime


class Renewal(IntEnum):
    """How `LeaseBackend.keep_many` answered for one lease."""

    REFUSED = 0  # another token holds it: the holder lost it
    RENEWED = 1  # its token held it, and holds it for the TTL from now
    TAKEN_BACK = 2  # nobody held it (gone with Redis's data, or run out): its token holds it again
    FREE = 3  # nobody holds it, and it was left free (`keep_many(..., take_back=False)`)


class LeaseBackendUnavailable(OrchestratorError):
    """The back end could not be reached or did not answer; the lease state is unknown.

    Callers treat it like a failed renewal once the lease may have run out, and retry otherwise.
    """

    code = "lease_backend_unavailable"
    http_status = 503


def new_token() -> str:
    """A fresh random token: 128 bits, hex, so it never contains a separator character."""
    return secrets.token_hex(16)


def ttl_milliseconds(ttl_seconds: float) -> int:
    """The TTL in whole milliseconds, rounded up so a tiny TTL never becomes "no expiry"."""
    if not math.isfinite(ttl_seconds) or ttl_seconds <= 0:
        raise ValueError(f"a lease TTL must be a positive number of seconds, not {ttl_seconds!r}")
    return max(1, math.ceil(ttl_seconds * 1000))


#: Limits of the SQL back end's columns, enforced in both back ends so they accept the same input.
MAX_NAME = 128
MAX_HOLDER = 255


def check_name(name: str) -> None:
    """Refuse a name either back end could not store."""
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"a lease name must have 1 to {MAX_NAME} characters")


def check_holder(holder: str) -> None:
    """Refuse a holder either back end could not store."""
    if len(holder) > MAX_HOLDER:
        raise ValueError(f"a lease holder must have at most {MAX_HOLDER} characters")


class LeaseBackend(ABC):
    """Named leases with random tokens. Implementations are safe to share between threads."""

    @abstractmethod
    def acquire(self, name: str, holder: str, ttl_seconds: float) -> str | None:
        """Take the lease for `ttl_seconds` and return a fresh token, or None if it is held."""

    @abstractmethod
    def renew(self, name: str, token: str, ttl_seconds: float) -> bool:
        """Extend the lease to now + `ttl_seconds` if `token` still holds it unexpired."""

    @abstractmethod
    def release(self, name: str, token: str) -> bool:
        """Give the lease up if `token` still holds it unexpired; otherwise change nothing."""

    @abstractmethod
    def get(self, name: str) -> LeaseInfo | None:
        """The lease as held now, or None when it is free or expired."""

    def get_many(self, names: Sequence[str]) -> list[LeaseInfo | None]:
        """`get` for each name, in order; back ends answer it in one round trip."""
        return [self.get(name) for name in names]

    def renew_many(self, held: Sequence[tuple[str, str]], ttl_seconds: float) -> list[bool]:
        """`renew` each (name, token), in order; back ends answer it in one round trip.

        One refusal answers False for that lease only; an unreachable back end raises
        `LeaseBackendUnavailable` for all of them.
        """
        return [self.renew(name, token, ttl_seconds) for name, token in held]

    def keep_many(
        self,
        held: Sequence[tuple[str, str, str]],
        ttl_seconds: float,
        *,
        take_back: bool = True,
    ) -> list[Renewal]:
        """Renew each (name, token, holder) its token holds, and take back, with the same token
        and holder, one that nobody holds any more; a lease another token holds is refused.
        Back ends answer it in one round trip, atomically per lease. With `take_back=False` a
        lease nobody holds is left free and answered `Renewal.FREE`.

        A lease is the liveness of a generation, not its authority: the store's fence is
        (invariant 9). So a holder whose lease vanished (Redis restarted empty, or the lease ran
        out while nobody took it) may hold it again, as long as the store says its generation
        is live: a generation's keeper asks with `take_back=False`, has the store's fenced
        mirror agree, and only then takes the lease back (`services/lease_keeper.py`), so a
        generation the store says is over never holds it again. This default cannot take back:
        a free lease is refused, as by `renew_many`.
        """
        renewed = self.renew_many([(name, token) for name, token, _ in held], ttl_seconds)
        return [Renewal.RENEWED if ok else Renewal.REFUSED for ok in renewed]

    @abstractmethod
    def close(self) -> None:
        """Free the connections this back end owns."""
