"""Keeps generations' leases alive: one heartbeat per process, renewals on writes, a safety margin.

A worker process may run hundreds of generations at once (the threads pool), so it does not
start a thread per generation: every `LeaseKeeper` joins the process's one `Heartbeat`, which
renews all the leases that are due in one round trip (`LeaseBackend.keep_many`) and mirrors
their expiries in one statement. The answer is per lease, so a refused renewal stops exactly the
generation it concerns.

A lease nobody holds any more (Redis restarted empty or was flushed; the lease ran out while
nobody took it) is taken back by its holder, with the same token, once the store agreed: the
renewal finds it free and leaves it so (`LeaseBackend.keep_many(..., take_back=False)`), the
expiry is mirrored in the store (the fenced update says whether the generation is still live),
and only a generation the store says is live takes its lease back (set if absent). One the store
says is over stops as for a refusal, having written nothing to the lease back end: a worker that
stalled while its generation was requeued never holds the next generation's lease, even for the
moment of its mirror, so the next generation's renewal in that moment is not refused (which
stopped a live round). The lease is the generation's liveness; the store's fence is its
authority (invariant 9), so a round in flight goes on through a Redis restart instead of losing
its generation. A lease another token holds is refused; the generation stops unless the store
says it is still live under this token. Then the other holder is a wake-up of the generation
that took the lease free after Redis lost its data and gives it back once the store tells it the
generation is claimed (a wake-up sent again that nothing marked as such, which takes the lease
before it reads the store): the round goes on, and takes the lease back once it is free, at a
next beat, within the lease it held (past that it stops as an outage). Before, that moment's
refusal stopped a live round and handed it back for nothing.

`lost` is set as soon as a generation can no longer be sure it holds its lease: a renewal was
refused, the store says the generation is over, or the last good renewal is older than the lease
minus a safety margin. The agent loop and the fenced tools stop on it.

`lapsed` tells why, for the count of losses (services/handback.py): the lease ran out while the
lease back end answered, so this process stalled (or its heartbeat did), which is a worker lost
as one that died is, not an outage of Redis or the store. A renewal refused while the lease was
still valid (Redis lost its data and another holder took the lease before this one took it
back) or a back end that could not be reached is an outage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import Connection
from sqlalchemy.exc import InterfaceError, OperationalError

from orchestrator.agent.loop import LeaseLost, StopSignal
from orchestrator.domain.fences import Fence
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable, Renewal
from orchestrator.leases.keys import task_lease
from orchestrator.store import executions as execution_store
from orchestrator.store.db import Database, cause_line
from orchestrator.store.heartbeats import held_open, mirror_leases
from orchestrator.store.types import utcnow

__all__ = ["Heartbeat", "LeaseKeeper", "heartbeat"]

log = logging.getLogger(__name__)

#: The shortest wait between two attempts for one lease (a back end that keeps failing).
MIN_RETRY_SECONDS = 0.05


#: How a generation ended elsewhere reads in the line that says its round stopped.
_ENDED = {
    "cancelled": "the task was cancelled",
    "superseded": "the generation was superseded",
    "lost": "the generation was found lost and requeued",
}


class LeaseKeeper:
    """Renews `fence`'s lease about every `renew_every` seconds, from `start()` to `close()`.

    `holder` is the name the lease was taken under (the worker's), kept when it is taken back.
    """

    def __init__(
        self,
        leases: LeaseBackend,
        db: Database,
        fence: Fence,
        *,
        holder: str,
        ttl: float,
        renew_every: float,
    ) -> None:
        self.leases = leases
        self.db = db
        self.fence = fence
        self.holder = holder
        self.ttl = ttl
        self.renew_every = renew_every
        self.margin = min(5.0, ttl * 0.1)
        #: Set, with why, once the generation can no longer be sure it holds its lease.
        self.lost = StopSignal()
        #: With `lost`: the lease ran out while the back end answered (this process stalled).
        self.lapsed = False
        self._unreachable = False  # the last renewal attempt could not reach the back end
        #: The last renewal was refused while the store said this generation live under its
        #: token: another holder has the lease for the moment (a wake-up of the generation).
        self._contested = False
        self._lock = threading.Lock()
        now = time.monotonic()
        self._valid_until = now + ttl
        self._mirrored_at = now  # the claim wrote the first mirror
        self._attempted_at = now  # and renewed the lease: the first beat is one period away
        self._renewed_at = now
        self.longest_gap = 0.0  # the longest time between two good renewals, for tests and logs
        self.renewals = 0  # good renewals since the claim, for tests

    @property
    def name(self) -> str:
        return task_lease(self.fence.task_id)

    def start(self) -> None:
        heartbeat().add(self)

    def renew_now(self, *, mirror: bool = True) -> bool:
        """Renew the lease, and mirror its expiry in the store; False (and `lost`) on refusal.

        `mirror=False` (renewals on writes) skips the store write when the mirror is fresh: the
        sweeper asks the lease back end before it requeues, so a mirror that lags is safe. A
        lease found free is always mirrored first: the store says whether it may be taken back.
        """
        if self.lost.is_set():
            return False
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        with self._lock:
            sent_at = time.monotonic()
            try:
                [answer] = self.leases.keep_many(
                    [(self.name, self.fence.lease_token, self.holder)], self.ttl, take_back=False
                )
            except LeaseBackendUnavailable:
                log.warning("lease back end unavailable while renewing %s", self.name)
                metrics.LEASE_RENEWAL_FAILURES.inc()
                self._unreachable = True
                self._check_overdue()
                return False
            if answer is Renewal.REFUSED:
                metrics.LEASE_RENEWAL_FAILURES.inc()
            fresh = sent_at - self._mirrored_at < self.renew_every / 2
            if answer is Renewal.RENEWED and not mirror and fresh:
                self._unreachable = False
                metrics.LEASE_RENEWALS.inc()
                self._renewed(sent_at)
                return True
            _settle([self], [answer], sent_at)
            if self._renewed_at >= sent_at:
                metrics.LEASE_RENEWALS.inc()
            return not self.lost.is_set() and self._renewed_at >= sent_at

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is surely still held."""
        self._check_overdue()
        if self.lost.is_set():
            raise LeaseLost(f"this generation no longer holds its lease: {self.lost.why}")

    def hear_why_over(self) -> None:
        """After the fence refused a write of the round: stop with why its generation ended, from
        the store, if the round has not heard it yet. A cancel announces itself after its
        commit, so a tool's own fenced write can be refused first; the line that says the round
        stopped (and its recovery snapshot) then names the cancel and its reason, not only the
        fence's "no longer live"."""
        if self.lost.is_set():
            return
        try:
            with self.db.transaction(readonly=True) as conn:
                over = _why_ended(conn, self.fence)
        except (OperationalError, InterfaceError) as exc:
            log.info("why generation %s ended was not read: %s", self.fence.generation, exc)
            return
        if over is not None:
            self._lose(over)

    def vouched_until(self) -> float:
        """The monotonic time until which the lease is surely held (now, once it is lost)."""
        if self.lost.is_set():
            return time.monotonic()
        return self._valid_until - self.margin

    def close(self) -> None:
        """Leave the heartbeat and release the lease (a no-op if someone else holds it)."""
        heartbeat().remove(self)
        try:
            self.leases.release(self.name, self.fence.lease_token)
        except LeaseBackendUnavailable:
            log.warning("could not release %s; it will expire", self.name)

    def due_at(self) -> float:
        """When the heartbeat should renew next: one period on, or earlier if it nears overdue."""
        return max(
            self._attempted_at + MIN_RETRY_SECONDS,
            min(self._attempted_at + self.renew_every, self._valid_until - self.margin),
        )

    def _renewed(self, sent_at: float) -> None:
        self._contested = False
        self._valid_until = max(self._valid_until, sent_at + self.ttl)
        self.longest_gap = max(self.longest_gap, sent_at - self._renewed_at)
        self.renewals += 1
        self._renewed_at = max(self._renewed_at, sent_at)

    def _taken_back(self) -> None:
        """The store said the generation is live, and its free lease is held again."""
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.LEASES_TAKEN_BACK.inc()
        log.warning(
            "generation %s of task %s found its lease gone (Redis lost its data, or it ran out "
            "while nobody took it); the store says it is live, and it took the lease back",
            self.fence.generation,
            self.fence.task_id,
        )

    def _check_overdue(self) -> None:
        if time.monotonic() > self._valid_until - self.margin:
            # Overdue while the back end answered and gave the lease: this process stalled.
            self._lose(
                "the last good renewal is older than the lease minus its safety margin",
                lapsed=not (self._unreachable or self._contested),
            )

    def _ran_out(self, sent_at: float) -> bool:
        """The lease ran out before this renewal was sent, while the back end answered and
        nobody else held it: this process stalled (a refusal then needs no store answer)."""
        return sent_at > self._valid_until and not (self._unreachable or self._contested)

    def _refused(self, sent_at: float) -> None:
        if self._ran_out(sent_at):
            self._lose(
                "the lease ran out before it was renewed (this process stalled)", lapsed=True
            )
        else:
            self._lose("the lease renewal was refused")

    def _held_elsewhere(self) -> None:
        """Refused, but the store says this generation is live under its token: another holder
        has the lease for the moment. Go on, within the lease this generation last renewed."""
        if not self._contested:
            log.warning(
                "generation %s of task %s: another holder has its lease for the moment (a "
                "wake-up of the generation, after Redis lost its data?), but the store says "
                "the generation is live under this worker's token; it goes on, and takes the "
                "lease back once it is free",
                self.fence.generation,
                self.fence.task_id,
            )
        self._contested = True
        self._unreachable = False
        self._check_overdue()

    def _lose(self, why: str, *, lapsed: bool = False) -> None:
        if not self.lost.is_set():
            self.lapsed = lapsed
            log.warning(
                "generation %s of task %s stops: %s", self.fence.generation, self.fence.task_id, why
            )
            self.lost.stop(why)


def _settle(group: list[LeaseKeeper], answers: list[Renewal], sent_at: float) -> None:
    """Act on one batch's answers (same back end, store and TTL): mirror the renewed and the
    free leases in one fenced statement and ask the store about the refused ones in the same
    transaction, take back the free ones the store says are live, let the refused ones it says
    are live go on (another holder for the moment), and stop the generations it says are over.
    Store errors propagate, with nothing taken back and the refused ones stopped."""
    first = group[0]
    renewed: list[LeaseKeeper] = []
    free: list[LeaseKeeper] = []
    refused: list[LeaseKeeper] = []
    for keeper, answer in zip(group, answers, strict=True):
        if answer is Renewal.REFUSED:
            if keeper._ran_out(sent_at):
                keeper._refused(sent_at)
            else:
                refused.append(keeper)
            continue
        keeper._unreachable = False
        if answer is Renewal.FREE:
            free.append(keeper)
            continue
        keeper._renewed(sent_at)
        renewed.append(keeper)
    mirrored = renewed + free
    if not mirrored and not refused:
        return
    try:
        with first.db.transaction() as conn:
            live = mirror_leases(conn, [_held(k) for k in mirrored], _expiry(first))
            live |= held_open(conn, [_held(k) for k in refused])
            # The rare generation ended elsewhere: its stop says by what (a cancel...).
            over = {
                keeper: _why_over(conn, keeper.fence)
                for keeper in mirrored + refused
                if (keeper.fence.task_id, keeper.fence.generation) not in live
            }
    except Exception:
        for keeper in free:  # not taken back: the store did not say; overdue is an outage
            keeper._unreachable = True
            keeper._check_overdue()
        for keeper in refused:  # the store did not say the generation is live
            keeper._refused(sent_at)
        raise
    for keeper in mirrored:
        if keeper in over:
            keeper._lose(over[keeper])
        else:
            keeper._mirrored_at = sent_at
    for keeper in refused:
        if keeper in over:
            keeper._lose(f"the lease renewal was refused: {over[keeper]}")
        else:
            keeper._held_elsewhere()
    taking = [k for k in free if k not in over]
    if not taking:
        return
    try:
        answers = first.leases.keep_many(
            [(k.name, k.fence.lease_token, k.holder) for k in taking], first.ttl
        )
    except LeaseBackendUnavailable:
        log.warning("lease back end unavailable while taking back %d lease(s)", len(taking))
        for keeper in taking:
            keeper._unreachable = True
            keeper._check_overdue()
        return
    for keeper, answer in zip(taking, answers, strict=True):
        if answer is Renewal.REFUSED:  # another holder took it since it was found free
            keeper._held_elsewhere()  # the store said live a moment ago
            continue
        keeper._renewed(sent_at)
        if answer is Renewal.TAKEN_BACK:
            keeper._taken_back()


def _held(keeper: LeaseKeeper) -> tuple[str, int, str]:
    return (keeper.fence.task_id, keeper.fence.generation, keeper.fence.lease_token)


def _expiry(keeper: LeaseKeeper) -> datetime:
    return utcnow() + timedelta(seconds=keeper.ttl)


def _why_over(conn: Connection, fence: Fence) -> str:
    """What ended the generation elsewhere (a cancel, a requeue, a sweep), from the store."""
    return _why_ended(conn, fence) or "the store says this generation is over"


def _why_ended(conn: Connection, fence: Fence) -> str | None:
    """`_why_over` when the store says how the generation ended, else None."""
    execution = execution_store.get_execution(conn, fence.task_id, fence.generation)
    if execution is None or execution.outcome is None:
        return None
    reason = " ".join((execution.reason or "").split())[:200]
    said = _ENDED.get(execution.outcome, f"the generation ended ({execution.outcome})")
    return f"{said}: {reason}" if reason else said


class Heartbeat:
    """One thread renewing the due leases of every registered keeper, a batch per round trip.

    The thread runs while at least one keeper is registered and stops when the last one leaves.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._keepers: set[LeaseKeeper] = set()
        self._in_flight: set[LeaseKeeper] = set()
        self._thread: threading.Thread | None = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._changed:
            self._keepers.add(keeper)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lease-heartbeat", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def remove(self, keeper: LeaseKeeper) -> None:
        """Unregister `keeper`; returns once no renewal of it is under way."""
        with self._changed:
            self._keepers.discard(keeper)
            self._changed.notify_all()
            self._changed.wait_for(lambda: keeper not in self._in_flight, timeout=30)

    def check_now(self, task_id: str) -> None:
        """Renew and mirror the leases of `task_id` at once: the store's answer tells a keeper
        whose generation was ended elsewhere (`services.generation_watch`) to stop."""
        with self._changed:
            for keeper in self._keepers:
                if keeper.fence.task_id == task_id:
                    keeper._attempted_at = float("-inf")  # due now
            self._changed.notify_all()

    def held(self) -> int:
        with self._changed:
            return len(self._keepers)

    def stop_all(self, why: str) -> int:
        """Stop every generation this process holds, as a lost lease does (its round saves its
        snapshot and hands the generation back); how many. For a process that is going away."""
        with self._changed:
            keepers = list(self._keepers)
        for keeper in keepers:
            keeper._lose(why)
        return len(keepers)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._keepers = {k for k in self._keepers if not k.lost.is_set()}
                if not self._keepers:
                    self._thread = None
                    return
                now = time.monotonic()
                due = [k for k in self._keepers if k.due_at() <= now]
                if not due:
                    next_due = min(k.due_at() for k in self._keepers)
                    self._changed.wait(max(0.001, next_due - now))
                    continue
                self._in_flight.update(due)
            try:
                groups: dict[tuple[int, int, float], list[LeaseKeeper]] = defaultdict(list)
                for keeper in due:
                    groups[(id(keeper.leases), id(keeper.db), keeper.ttl)].append(keeper)
                for group in groups.values():
                    self._beat(group)
            finally:
                with self._changed:
                    self._in_flight.difference_update(due)
                    self._changed.notify_all()

    @staticmethod
    def _beat(group: list[LeaseKeeper]) -> None:
        """Renew one group (same back end, store and TTL) in one call, then mirror it in one."""
        first = group[0]
        sent_at = time.monotonic()
        for keeper in group:
            keeper._attempted_at = sent_at
        try:
            answers = first.leases.keep_many(
                [(k.name, k.fence.lease_token, k.holder) for k in group], first.ttl, take_back=False
            )
        except Exception as exc:
            if not isinstance(exc, LeaseBackendUnavailable):
                log.exception("heartbeat of %d lease(s) failed", len(group))
            else:
                log.warning("lease back end unavailable while renewing %d lease(s)", len(group))
            for keeper in group:
                keeper._unreachable = True
                keeper._check_overdue()
            return
        try:
            _settle(group, answers, sent_at)
        except (OperationalError, InterfaceError) as exc:  # the store away: next beat retries
            log.warning(
                "mirroring %d lease(s) in the store failed (%s)", len(group), cause_line(exc)
            )
        except Exception:
            log.exception("mirroring %d lease(s) in the store failed", len(group))


_heartbeat: tuple[int, Heartbeat] | None = None
_heartbeat_lock = threading.Lock()


def heartbeat() -> Heartbeat:
    """This process's heartbeat; a new one after a fork (threads do not survive it)."""
    global _heartbeat
    with _heartbeat_lock:
        if _heartbeat is None or _heartbeat[0] != os.getpid():
            _heartbeat = (os.getpid(), Heartbeat())
        return _heartbeat[1]
