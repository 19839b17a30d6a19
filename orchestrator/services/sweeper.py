"""Recovery: requeue generations whose lease ran out, republish queued tasks whose wake-up is lost.

A sweep reads the store's index of running executions by mirrored lease expiry, so its cost grows
with the number of expired leases, not with the number of tasks. The expiries of one sweep are
handled as a batch: one lease read, one transaction (`store/lost.py`), one publish over one
broker connection. Every requeue is a compare-and-set on the execution row and the task's
generation: two sweepers never requeue one expiry twice. A lost generation's pending_approval
actions are superseded, each with its `action_superseded` event, in the transaction that requeues
or parks it.

Every requeue, whichever way the loss was found (an expired lease, a gone process), passes
through `Sweeper.requeue_lost`, which counts it in the metrics once it committed.

After the store was away, the first sweeps leave expired leases alone for `handback_grace`
seconds. A round the outage stopped is handed back by its worker (`services/handback.py`: tried
every second until the store answers) and then counts as an outage (`handbacks`); a lease that
ran out during a longer outage would otherwise be taken, by whichever sweep comes first once the
store is back, for a worker that died (`recoveries`), and three such outages park the task as
`recovery_limit`. A worker that really died waits those few seconds more. A one-shot sweep
(`orchestrator recover`) cannot know whether the store has just come back: it starts the
grace itself (`start_grace`) and sweeps again once the grace is over.

With Redis as the broker, a sweep also keeps a mark there (`BROKER_MARK`, a lease of its own).
Should it be gone, Redis lost its data (restarted empty, flushed), and the wake-ups of the queued
tasks went with it: the sweep sends them all again (`LOST_WAKE_UP_BATCHES` batches a sweep, the
rest at the next sweeps), instead of waiting ORCH_QUEUED_STALE_SECONDS for each to look lost. A
wake-up sent twice starts at most one agent.

A wake-up the broker refused at its commit (Redis down: a trigger, a requeue, a decision that
resumed a task) is recorded in the store (`services/dispatch.py`), and every sweep sends those
first, whether Redis came back with its data or without: the task starts within a sweep of the
broker's return. Each is claimed by a compare-and-set before it is sent (two sweepers never both
send it; one claimed by a worker meanwhile is left) and recorded again if the broker still
refuses it.

With Redis down a sweep can do little of this, and says so once an outage: one warning when
Redis first does not answer (what the sweep could not do, and that it tries again), one line
when it answers again, nothing at the sweeps between (`services/redis_outage.py`). A Redis that
answers but refuses (full, read-only, the sweeper's password no longer taken) is said as that,
once, and is no outage.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy.exc import InterfaceError, OperationalError

from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable, Renewal
from orchestrator.leases.keys import ended_key, task_lease
from orchestrator.leases.process import ProcessIdentity, is_gone
from orchestrator.services.dispatch import (
    Dispatcher,
    dispatch_failure,
    dispatch_many,
    record_unsent,
)
from orchestrator.services.handback import RETRY_SECONDS
from orchestrator.services.redis_outage import RedisOutage, SweepMisses, where
from orchestrator.settings import Settings
from orchestrator.store import action_notices as notice_store
from orchestrator.store import executions as execution_store
from orchestrator.store import generations as generation_store
from orchestrator.store import task_events as event_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database, wake_after_commit
from orchestrator.store.lost import Limits, LostBatch, held_on_host, requeue_lost
from orchestrator.store.records import ExecutionRecord, TaskRecord
from orchestrator.store.task_events import NewEvent
from orchestrator.store.types import utcnow

__all__ = [
    "BROKER_MARK",
    "HANDBACK_GRACE_SECONDS",
    "LEASE_EXPIRED",
    "PROCESS_GONE",
    "SweepReport",
    "Sweeper",
]

#: Why a generation whose lease ran out ended.
LEASE_EXPIRED = "the lease expired without renewal (worker lost)"
#: Why a generation whose worker process is gone ended before its lease ran out.
PROCESS_GONE = "its worker process is gone (found on the same host)"

log = logging.getLogger(__name__)

#: The tail of a hand-back's reason that said when it would be requeued.
_REQUEUED_IN: Final = re.compile(r"; requeued in [0-9.e+]+s$")

#: After a store outage, how long expired leases are left to their workers' hand-backs (tried
#: every `RETRY_SECONDS`) before a sweep takes them for workers that died.
HANDBACK_GRACE_SECONDS: Final = 3 * RETRY_SECONDS


#: The lease a sweeper keeps in Redis to notice that Redis lost its data (see the docstring),
#: and how long it lasts without a sweep: past that, one sweep sends every queued wake-up again.
BROKER_MARK: Final = "sweeper:broker"
BROKER_MARK_SECONDS: Final = 3600.0
#: How many batches of those wake-ups one sweep sends at most; the next sweeps send the rest.
#: A store with many queued tasks is not sent in one sweep, which would hold back the recovery
#: of expired leases (invariant 8) for as long as the sends take.
LOST_WAKE_UP_BATCHES: Final = 2
#: The token every sweeper keeps `BROKER_MARK` under (`Sweeper._broker_lost_data`).
_MARK_TOKEN: Final = "sweepers"


@dataclass
class SweepReport:
    """What one sweep did, for the CLI and the logs."""

    requeued: list[tuple[str, int, int]] = field(default_factory=list)  # task, lost gen, new gen
    parked: list[tuple[str, int]] = field(default_factory=list)
    republished: list[tuple[str, int]] = field(default_factory=list)
    #: Expired generations this sweep could not check (the lease back end was unavailable).
    deferred: int = 0
    #: Of `requeued` and `parked`, those their workers handed back, and why (a model server's
    #: Retry-After, an outage): planned, not a worker lost, and the log line says so.
    handed_back: dict[tuple[str, int], str] = field(default_factory=dict)
    #: Wake-ups (task, generation) this sweep sent and the broker did not take (Redis down):
    #: recorded in the store, the next sweep sends them first.
    unsent: list[tuple[str, int]] = field(default_factory=list)
    #: Why Redis did not answer this sweep, or refused it (its first error), or None: the
    #: sweeper said it once (`redis_outage.py`), so the loop need not say it at every sweep.
    redis_error: str | None = None
    #: Expired generations this sweep left to their workers' hand-backs (the grace after a
    #: store outage), for a later sweep.
    left: int = 0

    def after(self, earlier: SweepReport) -> SweepReport:
        """This report with what an `earlier` sweep of the same pass did put before it (a
        one-shot sweep run again once its grace is over: `orchestrator recover`)."""
        self.requeued[:0] = earlier.requeued
        self.parked[:0] = earlier.parked
        self.republished[:0] = earlier.republished
        self.handed_back = earlier.handed_back | self.handed_back
        self.unsent[:0] = earlier.unsent
        self.deferred += earlier.deferred
        return self

    def lines(self) -> list[str]:
        out = [
            f"requeued task {t}: generation {g} {self._ended(t, g)}, generation {n} queued"
            for t, g, n in self.requeued
        ]
        out += [
            f"parked task {t} as failed (recovery_limit) after generation {g} "
            f"{'was ' if (t, g) not in self.handed_back else ''}{self._ended(t, g)}"
            for t, g in self.parked
        ]
        out += [f"republished the wake-up of task {t} generation {g}" for t, g in self.republished]
        return out

    def _ended(self, task_id: str, generation: int) -> str:
        """How a requeued generation ended: lost, or handed back by its worker (and why)."""
        why = self.handed_back.get((task_id, generation))
        # The store's outcome stays `lost` (DESIGN: requeued as generation n+1), but a
        # hand-back is no lost worker: an operator reading "lost" looks for a crash.
        if why is None:
            return "lost"
        if why.startswith("handed back: "):  # a model server's: "handed back: <why>; ..."
            # Its "; requeued in Ns" is past: this line says the requeue itself.
            why = _REQUEUED_IN.sub("", why.removeprefix("handed back: "))
            return f"handed back ({why})"
        return why if why.startswith("handed back") else f"handed back ({why})"


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        leases: LeaseBackend,
        dispatcher: Dispatcher,
        batch: int = 500,
    ) -> None:
        self.settings = settings
        self.db = db
        self.leases = leases
        self.dispatcher = dispatcher
        self.batch = batch
        self.handback_grace = HANDBACK_GRACE_SECONDS
        self._store_away = False  # the last sweep failed on the store
        self._grace_until = 0.0  # time.monotonic()
        # When a sweep first left each expiry alone (time.monotonic()): one grace per expiry,
        # however many outages follow. A store that fails every other sweep would otherwise
        # restart the grace at each answer, and the lease of a worker that died would never
        # be recovered (invariant 8: within lease + sweep interval, here + the grace).
        self._left_since: dict[tuple[str, int], float] = {}
        #: Since Redis was found without its data: the wake-ups of the tasks queued before this
        #: are sent again, `LOST_WAKE_UP_BATCHES` batches a sweep, until none is left.
        self._lost_before: datetime | None = None
        self._holder = f"sweeper:{socket.gethostname()}"
        #: Redis not answering, said once an outage (None: no Redis, embedded mode).
        self.redis_outage = (
            RedisOutage(where(settings.redis_url), settings.sweep_seconds)
            if settings.redis_url
            else None
        )
        self._misses = SweepMisses()  # this sweep's

    def sweep(self, now: datetime | None = None) -> SweepReport:
        self._misses = SweepMisses()
        try:
            report = self._sweep(now or utcnow())
        except (OperationalError, InterfaceError):
            self._store_away = True
            raise
        report.redis_error = self._misses.error or self._misses.refused
        if self.redis_outage is not None:  # a whole sweep: Redis answered it all, or not
            self.redis_outage.swept(self._misses)
        return report

    def _missed(self, exc: BaseException) -> None:
        """A call to Redis failed: the error for the line that says it, an outage or a refusal
        (`redis_outage.py`); the caller counts what it could not do."""
        self._misses.note(exc)

    def _sweep(self, now: datetime) -> SweepReport:
        report = SweepReport()
        with self.db.transaction(readonly=True) as conn:
            expired = execution_store.expired_executions(conn, now, self.batch)
        if self._store_away:  # the store answers again
            self._store_away = False
            self._grace_until = time.monotonic() + self.handback_grace
        due = self._past_grace(expired)
        report.left = len(expired) - len(due)
        expired = due
        if expired:
            self._recover(expired, now, report)
        self.recover_gone_processes(report)
        if self._broker_lost_data():  # queued before this sweep: a touched one is queued after
            self._lost_before = min(now, utcnow())
        self._republish_stale(now, report)
        return report  # what it did (`report.lines()`) is said by the caller: printed or logged

    def start_grace(self) -> float:
        """Leave expired leases to their workers' hand-backs for a grace from now, as after a
        store outage; the seconds it lasts. For a sweep run once, which did not see whether
        the store was away."""
        self._grace_until = time.monotonic() + self.handback_grace
        return self.handback_grace

    def grace_left(self) -> float:
        """Seconds until the grace is over (0 when there is none)."""
        return max(0.0, self._grace_until - time.monotonic())

    def _past_grace(self, expired: list[ExecutionRecord]) -> list[ExecutionRecord]:
        """The expiries to recover now: all of them, or, in the grace after an outage, those
        already left alone for a whole grace (by this or an earlier one)."""
        clock = time.monotonic()
        if clock >= self._grace_until:
            self._left_since.clear()
            return expired
        left_since = {
            key: self._left_since.get(key, clock)
            for key in ((e.task_id, e.generation) for e in expired)
        }
        self._left_since = left_since  # those no longer expired (handed back) are forgotten
        due = [
            e
            for e in expired
            if clock - left_since[(e.task_id, e.generation)] >= self.handback_grace
        ]
        if len(due) < len(expired):
            log.info(
                "%d expired lease(s) left for a later sweep: the store is back from an outage, "
                "and rounds it stopped are handed back by their workers first",
                len(expired) - len(due),
            )
        return due

    def _recover(self, expired: list[ExecutionRecord], now: datetime, report: SweepReport) -> None:
        """One lease read for the batch, one transaction, one publish over one connection."""
        try:
            infos = self.leases.get_many([task_lease(e.task_id) for e in expired])
        except LeaseBackendUnavailable as exc:
            if self.redis_outage is None:  # the store's leases: the store's own trouble
                log.warning(
                    "lease back end unavailable; %d expiries left for the next sweep", len(expired)
                )
            self._missed(exc)
            self._misses.unchecked += len(expired)
            report.deferred += len(expired)
            return
        lost: list[tuple[str, int]] = []
        for execution, info in zip(expired, infos, strict=True):
            if info is not None and info.token == execution.lease_token:
                # Still held: only the store's mirror is behind (a renewal's mirror write failed).
                with self.db.transaction() as conn:
                    generation_store.mirror_lease(
                        conn, execution.task_id, execution.generation, info.token, info.expires_at
                    )
                continue
            lost.append((execution.task_id, execution.generation))
        self.requeue_lost(lost, LEASE_EXPIRED, report, expired_before=now)

    def recover_gone_processes(self, report: SweepReport | None = None) -> SweepReport:
        """Requeue now the generations whose claiming process on this host no longer exists
        (and that it had not handed back: their mirrored lease says when they are requeued).

        Their leases are still live, so each is released with the dead holder's own token
        (compare-and-delete: a lease someone else took since is left alone) before the next
        generation's wake-up goes out. Runs at every sweep and when a worker starts.
        """
        report = report if report is not None else SweepReport()
        with self.db.transaction(readonly=True) as conn:
            held = held_on_host(conn, socket.gethostname())
        verdicts: dict[ProcessIdentity, bool] = {}
        gone = [h for h in held if verdicts.setdefault(h.process, is_gone(h.process)) is True]
        for h in gone:
            log.warning(
                "generation %s of task %s: its worker process %s on %s is gone",
                h.generation,
                h.task_id,
                h.process.pid,
                h.process.host,
            )
        tokens = {(h.task_id, h.generation): h.lease_token for h in gone}
        self.requeue_lost(list(tokens), PROCESS_GONE, report, release=tokens)
        return report

    def requeue_lost(
        self,
        lost: list[tuple[str, int]],
        reason: str,
        report: SweepReport,
        *,
        release: dict[tuple[str, int], str | None] | None = None,
        expired_before: datetime | None = None,
    ) -> None:
        """Close `lost` generations and requeue (or park) their tasks, then wake the new ones.

        `release` gives the lost holders' lease tokens when their leases may still be live;
        `expired_before` closes only those whose mirrored lease is still expired then (a holder
        that took its lease back meanwhile mirrored it first: `store.lost.requeue_lost`).
        """
        if not lost:
            return
        with self.db.transaction() as conn:
            batch = requeue_lost(
                conn,
                lost,
                reason=reason,
                limits=Limits(self.settings.max_recoveries, self.settings.max_handbacks),
                expired_before=expired_before,
            )
            # A worker still running a lost generation (paused, cut off) stops at once.
            for task_id, _generation in [(t, g) for t, g, _ in batch.requeued] + batch.parked:
                wake_after_commit(conn, ended_key(task_id))
            # The task stream and the webhooks see each move, in the same transaction: first
            # the proposals that went away with the lost generations, then the move itself.
            notice_store.record_superseded(conn, batch.superseded)
            event_store.record_events(
                conn,
                [
                    NewEvent(
                        t, "queued", nxt, reason=f"generation {g}: {batch.reason(t, g, reason)}"
                    )
                    for t, g, nxt in batch.requeued
                ]
                + [
                    NewEvent(
                        t,
                        "failed",
                        reason=f"recovery_limit: generation {g}: {batch.reason(t, g, reason)}",
                    )
                    for t, g in batch.parked
                ],
            )
        report.requeued += batch.requeued
        report.parked += batch.parked
        report.handed_back.update({key: batch.reason(*key, reason) for key in batch.handed_back})
        _observe_recoveries(batch)
        for task_id, generation in [(t, g) for t, g, _ in batch.requeued] + batch.parked:
            token = (release or {}).get((task_id, generation))
            if token is None:
                continue
            try:
                self.leases.release(task_lease(task_id), token)
            except LeaseBackendUnavailable as exc:
                if self.redis_outage is None:
                    log.warning("could not release the lease of %s; it will expire", task_id)
                self._missed(exc)
                self._misses.unreleased += 1
        wakeups = [(t, n) for t, _, n in batch.requeued]
        sent, why = dispatch_many(
            self.dispatcher, wakeups, quiet=self.redis_outage is not None, on_error=self._missed
        )
        unsent = [w for w, ok in zip(wakeups, sent, strict=True) if not ok]
        if why is not None:
            self._misses.unsent += len(unsent)
        record_unsent(self.db, unsent)
        report.unsent += unsent

    def _broker_lost_data(self) -> bool:
        """Whether Redis lost its data since the last sweep: `BROKER_MARK` was gone. Also True
        when no sweeper kept the mark yet (a new Redis, or one that lost its data while no
        sweeper ran): at worst every queued task is woken twice, which starts nothing more.

        Every sweeper keeps the one mark under the same token (`_MARK_TOKEN`), whichever made
        it: one that kept its own (a lease of its own token) could not renew a mark another
        sweeper made, the one of a sweeper restarted or stopped, and when that mark ran out
        (an hour after) it took it for Redis's data lost and sent every wake-up again."""
        if not self.settings.redis_url:
            return False  # the file-system broker keeps its messages on disk
        try:
            [kept] = self.leases.keep_many(
                [(BROKER_MARK, _MARK_TOKEN, self._holder)], BROKER_MARK_SECONDS
            )
        except LeaseBackendUnavailable as exc:
            self._missed(exc)
            self._misses.mark = True
            return False  # Redis away: a later sweep finds the mark gone
        if kept is not Renewal.TAKEN_BACK:
            return False  # there, and renewed (or one an older sweeper made, there as well)
        log.warning(
            "the sweeper's mark in Redis was missing (Redis restarted empty, was flushed or is "
            "new, or no sweeper ran for an hour): every queued task's wake-up is sent again"
        )
        return True

    def _send_again(self, task: TaskRecord, report: SweepReport) -> bool:
        """Claim one republish (compare-and-set: not claimed, already sent by another sweeper,
        or taken by a worker, it is left) and send it, again=True; a wake-up the broker did not
        take is recorded as unsent, for the next sweep. False when the broker refused it."""
        with self.db.transaction() as conn:
            claimed = task_store.touch_queued(conn, task)
        if not claimed:
            return True
        why = dispatch_failure(
            self.dispatcher,
            task.task_id,
            task.generation,
            again=True,
            quiet=self.redis_outage is not None,
            on_error=self._missed,
        )
        if why is not None:
            self._misses.unsent += 1
            record_unsent(self.db, [(task.task_id, task.generation)])
            report.unsent.append((task.task_id, task.generation))
            return False
        report.republished.append((task.task_id, task.generation))
        return True

    def _republish_stale(self, now: datetime, report: SweepReport) -> None:
        """Send the wake-ups the broker refused at their commits (recorded in the store), first,
        and again those of the tasks queued for ORCH_QUEUED_STALE_SECONDS (that long unclaimed,
        theirs may be lost): one batch a sweep. Since Redis lost its data, those of
        every task queued before (`_lost_before`), `LOST_WAKE_UP_BATCHES` batches a sweep,
        until a batch comes back short; a broker that does not take one stops them until the
        next sweep."""
        before = now - timedelta(seconds=self.settings.queued_stale_seconds)
        lost = self._lost_before is not None and self._lost_before > before
        if lost and self._lost_before is not None:
            before = self._lost_before
        else:
            self._lost_before = None  # the stale ones are all of them now
        for _ in range(LOST_WAKE_UP_BATCHES if lost else 1):
            with self.db.transaction(readonly=True) as conn:
                stale = task_store.stale_queued(conn, before, self.batch)
            for task in stale:
                if not self._send_again(task, report):
                    return  # the broker away: one line, not one a task; the next sweep goes on
            if len(stale) < self.batch:
                self._lost_before = None  # every lost wake-up is sent again
                return


def _observe_recoveries(batch: LostBatch) -> None:
    """Each generation this batch requeued, once: a recovery (and a hand-back, if its worker
    handed it back after an outage), and its delay since its lease expired.

    Only what this batch's compare-and-set moved is counted, so a generation another sweeper
    requeued first counts once, there. A gone process is found before its lease runs out: its
    delay is 0.
    """
    if not batch.requeued:
        return
    from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

    metrics.RECOVERIES.inc(len(batch.requeued))
    metrics.HANDBACKS.inc(sum(1 for t, g, _ in batch.requeued if (t, g) in batch.handed_back))
    for task_id, generation, _ in batch.requeued:
        expired = batch.lease_expiries.get((task_id, generation))
        delay = 0.0
        if expired is not None and batch.at is not None:
            delay = max(0.0, (batch.at - expired).total_seconds())
        metrics.RECOVERY_DELAY.observe(delay)
