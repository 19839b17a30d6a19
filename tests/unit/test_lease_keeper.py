"""LeaseKeeper over a fake lease back end and a real SQLite store with a claimed generation."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from orchestrator.agent.loop import LeaseLost
from orchestrator.domain.fences import Fence
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable, LeaseInfo
from orchestrator.leases.keys import task_lease
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store import generation_claims as claim_store
from orchestrator.store.db import Database
from orchestrator.store.types import utcnow

TOKEN = "0123456789abcdef0123456789abcdef"


@dataclass
class FakeLeases(LeaseBackend):
    """Answers renewals as told: True, False, or LeaseBackendUnavailable; records every call."""

    answer: bool | None = True  # None: the back end is unavailable
    renewals: list[tuple[float, str, str, float]] = field(default_factory=list)
    releases: list[tuple[str, str]] = field(default_factory=list)
    release_fails: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, name: str, holder: str, ttl_seconds: float) -> str | None:
        return TOKEN

    def renew(self, name: str, token: str, ttl_seconds: float) -> bool:
        with self._lock:
            self.renewals.append((time.monotonic(), name, token, ttl_seconds))
            answer = self.answer
        if answer is None:
            raise LeaseBackendUnavailable("the fake back end is down")
        return answer

    def release(self, name: str, token: str) -> bool:
        self.releases.append((name, token))
        if self.release_fails:
            raise LeaseBackendUnavailable("the fake back end is down")
        return True

    def get(self, name: str) -> LeaseInfo | None:
        return None

    def close(self) -> None:
        pass

    def renew_count(self) -> int:
        with self._lock:
            return len(self.renewals)


@dataclass
class Claimed:
    db: Database
    tasks: TaskService
    fence: Fence


@pytest.fixture
def claimed(sqlite_url: str) -> Iterator[Claimed]:
    """A task whose generation 1 is claimed (running) with TOKEN, in a real SQLite store."""
    db = Database.from_url(sqlite_url)
    service = TaskService(db, RecordingDispatcher())
    task = service.trigger(Trigger(task_type="keeper", title="Lease keeper")).task
    with db.transaction() as conn:
        assert claim_store.claim_generation(
            conn,
            task.task_id,
            1,
            lease_token=TOKEN,
            worker="w1",
            celery_task_id=None,
            lease_expires_at=utcnow() + timedelta(seconds=120),
        )
    yield Claimed(db, service, Fence(task.task_id, 1, TOKEN))
    db.dispose()


@pytest.fixture
def leases() -> FakeLeases:
    return FakeLeases()


def keeper_for(
    claimed: Claimed, leases: FakeLeases, *, ttl: float = 0.5, renew_every: float = 0.1
) -> LeaseKeeper:
    return LeaseKeeper(
        leases, claimed.db, claimed.fence, holder="w1", ttl=ttl, renew_every=renew_every
    )


def mirrored_expiry(claimed: Claimed) -> datetime | None:
    with claimed.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(
            conn, claimed.fence.task_id, claimed.fence.generation
        )
    assert execution is not None
    return execution.lease_expires_at


def sleep_until(start: float, offset: float) -> None:
    time.sleep(max(0.0, start + offset - time.monotonic()))


def test_a_refused_renewal_sets_lost_once_the_store_says_the_generation_is_over(
    claimed: Claimed, leases: FakeLeases
) -> None:
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=10)
    keeper.check()  # fresh: held
    leases.answer = False
    # Refused while the store says the generation is live under its token: another holder has
    # the lease for the moment (a wake-up of the generation after Redis lost its data). It
    # goes on, within the lease it last renewed.
    assert keeper.renew_now() is False
    assert not keeper.lost.is_set()
    keeper.check()
    assert leases.renewals[0][1:] == (task_lease(claimed.fence.task_id), TOKEN, 30)
    claimed.tasks.cancel(claimed.fence.task_id, "an operator's cancel")
    assert keeper.renew_now() is False
    assert keeper.lost.is_set()
    assert not keeper.lapsed  # refused while still valid: not this process stalling
    assert (keeper.lost.why or "").startswith("the lease renewal was refused: ")
    assert "cancelled" in (keeper.lost.why or "")
    with pytest.raises(LeaseLost):
        keeper.check()
    # Lost is final: a later renewal is not even attempted, and a good answer does not undo it.
    leases.answer = True
    assert keeper.renew_now() is False
    assert keeper.lost.is_set()
    assert leases.renew_count() == 2


def test_a_renewal_refused_until_the_lease_nears_its_end_stops_as_an_outage(
    claimed: Claimed, leases: FakeLeases
) -> None:
    """Another holder that keeps the lease does not keep the round going past its lease."""
    keeper = keeper_for(claimed, leases, ttl=0.3, renew_every=10)
    leases.answer = False
    assert keeper.renew_now() is False
    assert not keeper.lost.is_set()
    time.sleep(0.35)
    assert keeper.renew_now() is False
    assert keeper.lost.is_set()
    assert not keeper.lapsed  # the lease was held by another, not let run out by a stall


def test_check_raises_once_the_last_renewal_is_older_than_ttl_minus_margin(
    claimed: Claimed, leases: FakeLeases
) -> None:
    ttl = 0.5
    start = time.monotonic()
    keeper = keeper_for(claimed, leases, ttl=ttl, renew_every=10)
    assert 0 < keeper.margin < ttl
    sleep_until(start, ttl / 2)
    keeper.check()
    assert not keeper.lost.is_set()
    # Past ttl - margin but before the lease itself would run out: already too late to write.
    sleep_until(start, ttl - keeper.margin / 2)
    with pytest.raises(LeaseLost):
        keeper.check()
    assert keeper.lost.is_set()
    assert keeper.lapsed  # overdue while the back end answered: this process stalled
    assert leases.renew_count() == 0  # nobody renewed; check() itself does not renew


def test_a_renewal_refused_after_the_lease_ran_out_is_a_lapse(
    claimed: Claimed, leases: FakeLeases
) -> None:
    # The process stalled past its lease; on waking its heartbeat's renewal is refused.
    keeper = keeper_for(claimed, leases, ttl=0.2, renew_every=10)
    time.sleep(0.25)
    leases.answer = False
    assert keeper.renew_now() is False
    assert keeper.lost.is_set()
    assert keeper.lapsed
    assert "stalled" in (keeper.lost.why or "")


def test_a_long_safety_margin_is_capped(claimed: Claimed, leases: FakeLeases) -> None:
    keeper = keeper_for(claimed, leases, ttl=120, renew_every=40)
    assert 0 < keeper.margin <= 0.1 * 120


def test_renew_now_extends_validity(claimed: Claimed, leases: FakeLeases) -> None:
    ttl = 0.5
    start = time.monotonic()
    keeper = keeper_for(claimed, leases, ttl=ttl, renew_every=10)
    sleep_until(start, 0.3)
    renewed_at = time.monotonic()
    assert keeper.renew_now() is True
    # Older than ttl since the keeper was made, but the renewal counts from when it was sent.
    sleep_until(start, 0.6)
    keeper.check()
    assert not keeper.lost.is_set()
    sleep_until(renewed_at, ttl + 0.02)
    with pytest.raises(LeaseLost):
        keeper.check()


def test_the_heartbeat_renews_about_every_renew_every(claimed: Claimed, leases: FakeLeases) -> None:
    ttl, every = 1.0, 0.2
    keeper = keeper_for(claimed, leases, ttl=ttl, renew_every=every)
    start = time.monotonic()
    keeper.start()
    try:
        time.sleep(1.5)
        keeper.check()  # 1.5 s > ttl: only the heartbeat kept it alive
    finally:
        keeper.close()
    times = [at for at, *_ in leases.renewals]
    assert 4 <= len(times) <= 9, times
    assert times[0] - start >= every * 0.8  # the first beat waits one period (claim renewed)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert every * 0.7 <= statistics.median(gaps) <= every * 1.6, gaps
    assert all(name == task_lease(claimed.fence.task_id) for _, name, _, _ in leases.renewals)
    assert all(token == TOKEN and t == ttl for _, _, token, t in leases.renewals)
    assert not keeper.lost.is_set()


def test_the_heartbeat_mirrors_the_expiry_in_the_store(
    claimed: Claimed, leases: FakeLeases
) -> None:
    before = mirrored_expiry(claimed)
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=0.1)
    keeper.start()
    try:
        time.sleep(0.35)
    finally:
        keeper.close()
    after = mirrored_expiry(claimed)
    assert before is not None
    assert after is not None
    assert after != before
    assert abs((after - utcnow()).total_seconds() - 30) < 2


def test_a_refusal_seen_by_the_heartbeat_sets_lost_promptly(
    claimed: Claimed, leases: FakeLeases
) -> None:
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=0.1)
    leases.answer = False
    # The generation ended elsewhere (the store says so), and another token holds its lease.
    claimed.tasks.cancel(claimed.fence.task_id)
    keeper.start()
    try:
        assert keeper.lost.wait(1.0)
    finally:
        keeper.close()
    with pytest.raises(LeaseLost):
        keeper.check()


def test_mirror_false_skips_the_store_write_while_the_mirror_is_fresh(
    claimed: Claimed, leases: FakeLeases
) -> None:
    every = 0.4
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=every)
    claimed_mirror = mirrored_expiry(claimed)
    # Right after the claim (which wrote the mirror): the lease is renewed, the store is not.
    assert keeper.renew_now(mirror=False) is True
    assert leases.renew_count() == 1
    assert mirrored_expiry(claimed) == claimed_mirror
    # A full renewal writes the mirror; a write renewal right after it skips it again.
    assert keeper.renew_now() is True
    full_mirror = mirrored_expiry(claimed)
    assert full_mirror != claimed_mirror
    assert keeper.renew_now(mirror=False) is True
    assert mirrored_expiry(claimed) == full_mirror
    assert leases.renew_count() == 3
    # Once the mirror is older than a renewal period, a write renewal refreshes it too.
    time.sleep(every + 0.05)
    assert keeper.renew_now(mirror=False) is True
    assert mirrored_expiry(claimed) != full_mirror
    assert not keeper.lost.is_set()


@pytest.mark.parametrize("how", ["cancel", "requeue"])
def test_a_generation_ended_in_the_store_sets_lost(
    claimed: Claimed, leases: FakeLeases, how: str
) -> None:
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=10)
    assert keeper.renew_now() is True
    if how == "cancel":
        claimed.tasks.cancel(claimed.fence.task_id, "operator stop")
    else:
        claimed.tasks.requeue(claimed.fence.task_id, "fresh look")
    # The lease back end still says yes; only the store knows the generation is over.
    assert keeper.renew_now() is False
    assert keeper.lost.is_set()
    # It says what happened (before: "the lease may have run out", misleading after a cancel).
    said = {
        "cancel": "the task was cancelled: operator stop",
        "requeue": "the generation was superseded: requeued by an operator: fresh look",
    }[how]
    assert keeper.lost.why == said
    with pytest.raises(LeaseLost, match=said):
        keeper.check()


def test_close_releases_the_lease_and_stops_the_heartbeat(
    claimed: Claimed, leases: FakeLeases
) -> None:
    every = 0.1
    keeper = keeper_for(claimed, leases, ttl=5, renew_every=every)
    keeper.start()
    time.sleep(0.35)
    assert leases.renew_count() >= 1
    started = time.monotonic()
    keeper.close()
    assert time.monotonic() - started < every + 1
    assert leases.releases == [(task_lease(claimed.fence.task_id), TOKEN)]
    count = leases.renew_count()
    time.sleep(every * 4)
    assert leases.renew_count() == count
    assert not [t for t in threading.enumerate() if t.name == "lease-heartbeat" and t.is_alive()]


def test_close_survives_an_unavailable_back_end(claimed: Claimed, leases: FakeLeases) -> None:
    keeper = keeper_for(claimed, leases, ttl=5, renew_every=0.1)
    keeper.start()
    leases.release_fails = True
    keeper.close()  # the lease will expire on its own
    assert leases.releases == [(task_lease(claimed.fence.task_id), TOKEN)]


def test_an_unavailable_back_end_is_not_lost_until_overdue(
    claimed: Claimed, leases: FakeLeases
) -> None:
    ttl, every = 0.8, 0.1
    keeper = keeper_for(claimed, leases, ttl=ttl, renew_every=every)
    start = time.monotonic()
    leases.answer = None
    # A direct renewal that cannot reach the back end fails without losing the lease yet.
    assert keeper.renew_now() is False
    assert not keeper.lost.is_set()
    keeper.start()
    try:
        sleep_until(start, ttl / 2)
        keeper.check()
        assert not keeper.lost.is_set()
        assert leases.renew_count() >= 3  # the heartbeat keeps retrying
        # The heartbeat itself notices the overdue lease, without anyone calling check().
        assert keeper.lost.wait(ttl)
        assert time.monotonic() - start <= ttl + 0.1
    finally:
        keeper.close()
    with pytest.raises(LeaseLost):
        keeper.check()
    assert not keeper.lapsed  # the back end was away: an outage, not a stalled worker


def test_a_back_end_back_in_time_keeps_the_lease(claimed: Claimed, leases: FakeLeases) -> None:
    ttl = 0.8
    keeper = keeper_for(claimed, leases, ttl=ttl, renew_every=0.1)
    start = time.monotonic()
    leases.answer = None
    keeper.start()
    try:
        sleep_until(start, 0.3)
        leases.answer = True
        sleep_until(start, ttl + 0.4)
        keeper.check()  # renewed after the outage: still held well past the first ttl
        assert not keeper.lost.is_set()
    finally:
        keeper.close()


def test_a_store_away_at_the_mirror_is_one_warning_line_not_a_traceback(
    claimed: Claimed,
    leases: FakeLeases,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # During a Postgres outage every beat of every worker fails its mirror: each was a full
    # traceback (about 35 per 3 s outage in the fault campaign), and said nothing more than the
    # driver's own message. The lease itself is renewed in Redis meanwhile: nothing is lost.
    from sqlalchemy.exc import OperationalError

    from orchestrator.services import lease_keeper

    def store_away(*_args: object, **_kwargs: object) -> None:
        raise OperationalError(
            "UPDATE executions ...",
            {"token": TOKEN},
            Exception("server closed the connection unexpectedly\nThis probably means..."),
        )

    monkeypatch.setattr(lease_keeper, "mirror_leases", store_away)
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=0.05)
    with caplog.at_level("WARNING", logger="orchestrator.services.lease_keeper"):
        keeper.start()
        try:
            time.sleep(0.3)
            keeper.check()  # not lost: Redis renewed it
        finally:
            keeper.close()
    failed = [r for r in caplog.records if "mirroring" in r.getMessage()]
    assert failed, caplog.text
    for record in failed:
        assert record.levelname == "WARNING"
        assert record.exc_info is None
        assert record.getMessage().endswith(
            "(OperationalError: server closed the connection unexpectedly)"
        )
        assert TOKEN not in record.getMessage()


def test_a_mirror_that_fails_on_a_bug_keeps_its_traceback(
    claimed: Claimed,
    leases: FakeLeases,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only a store that is away (OperationalError, InterfaceError) is one line: a programming
    # or data error (a column a migration did not add, a value of the wrong type) is a bug, and
    # its traceback is what finds it. (An IntegrityError reaches here as ConstraintViolation.)
    from sqlalchemy.exc import ProgrammingError

    from orchestrator.services import lease_keeper

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ProgrammingError(
            "UPDATE executions ...", {}, Exception('column "lease_expires_at" does not exist')
        )

    monkeypatch.setattr(lease_keeper, "mirror_leases", broken)
    keeper = keeper_for(claimed, leases, ttl=30, renew_every=0.05)
    with caplog.at_level("WARNING", logger="orchestrator.services.lease_keeper"):
        keeper.start()
        try:
            time.sleep(0.3)
        finally:
            keeper.close()
    failed = [r for r in caplog.records if "mirroring" in r.getMessage()]
    assert failed, caplog.text
    assert all(record.exc_info is not None for record in failed), [
        (r.levelname, r.getMessage()) for r in failed
    ]
