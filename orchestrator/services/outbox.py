"""The outbox dispatcher: sends what the outbox holds to the business backend, until a 2xx.

It runs in the sweeper process (a thread of `orchestrator sweeper`) or alone
(`orchestrator outbox dispatch`). A round claims due rows (the claim, with its attempt counted
and a hold as long as one send may take, commits first), sends each outside any transaction
with a bounded timeout (the hold renewed while a send lasts longer, up to `_SEND_TIMEOUTS`
timeouts), then records the result:
delivered, or the error and the next attempt after an exponential backoff (or the backend's
`Retry-After`). A dispatcher killed mid-send
leaves its rows to be sent again when the hold runs out: at least once, and exactly once for a
backend that honours the action id as `Idempotency-Key`. A row the backend refuses for good (a
permanent 4xx, `delivery_answers`), and a webhook that failed `ORCH_WEBHOOK_MAX_ATTEMPTS` times,
is dead-lettered until an operator retries it, or discards it once dealt with by hand (the
backend will never take those bytes: the task's later events then go on); a failing row not
being sent may be discarded too (an action the backend answers 500 for every time is never
dead-lettered, and would be sent for ever). A 429 is not a
failure there: the backend asks for time, and a burst it rate-limits must not dead-letter
webhooks and stop their tasks' event streams, so throttled attempts are counted apart
(`outbox.throttled`) and back off without counting. How a send is signed: `outbox_signing`.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Connection

from orchestrator.errors import ConflictError, InvalidTransition, NotFound, echoed
from orchestrator.logs import redact, secrets_of
from orchestrator.services.delivery_answers import (
    RETRY_AFTER_STATUSES,
    THROTTLED,
    backoff_seconds,
    is_permanent_refusal,
    retry_after_seconds,
)
from orchestrator.services.outbox_signing import SIGNATURE_HEADER, sign, signature_headers
from orchestrator.settings import Settings
from orchestrator.store import outbox_operator, outbox_sending, outbox_views
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.outbox import REFUSAL, OutboxRow
from orchestrator.store.types import utcnow

if TYPE_CHECKING:
    import httpx

__all__ = [
    "EVENT_ID_HEADER",
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "DispatchReport",
    "OutboxDispatcher",
    "OutboxService",
    "sign",
]

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
#: The largest outbox id the store can hold (a BIGINT on Postgres, SQLite's 64-bit rowid).
MAX_OUTBOX_ID: Final = 2**63 - 1
EVENT_ID_HEADER: Final = "X-Orchestrator-Event-Id"
#: Beyond the send timeout, how long a claimed row stays held before another dispatcher may
#: take it (a dispatcher that died mid-send): the timeout again, at most this much.
_HOLD_MARGIN_SECONDS: Final = 5.0

#: A throttled webhook's error: why the attempt did not bring it nearer to being dead-lettered.
_THROTTLED_WEBHOOK: Final = "throttled: not counted toward ORCH_WEBHOOK_MAX_ATTEMPTS"

#: Unauthorized, Forbidden: a refusal of who sent it (the signature), not of what was sent.
_UNAUTHORISED: Final = frozenset({401, 403})

#: The longest wait between outbox rounds that failed (the store or the network away).
_MAX_BACKOFF_SECONDS: Final = 30.0


@dataclass
class DispatchReport:
    delivered: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    throttled: list[int] = field(default_factory=list)  # answered 429: not counted as failed

    @property
    def sent(self) -> int:
        return len(self.delivered) + len(self.failed) + len(self.dead) + len(self.throttled)


@dataclass(frozen=True)
class _Answer:
    """One send's outcome: delivered (no error), or the error and what it means for the row."""

    error: str | None = None
    permanent: bool = False  # the backend refuses this body for good: dead-letter it now
    retry_after: float | None = None  # the wait the backend asked for (429, 503), in seconds
    throttled: bool = False  # a 429: backed off, but not counted toward the webhook's limit


#: A send is given up once its answer is this many read timeouts late (60 s by default): each
#: read within the timeout, a trickling backend would otherwise keep one send going for ever.
_SEND_TIMEOUTS: Final = 6


class OutboxDispatcher:
    """Claims, sends and records; `run_once` is one round, `run` loops until `stop` is set.

    httpx is imported by the methods that send: the operator's commands on the outbox
    (`OutboxService`, below) import this module and never send."""

    def __init__(
        self, settings: Settings, db: Database, client: httpx.Client | None = None, batch: int = 20
    ) -> None:
        self.settings = settings
        self.db = db
        self.batch = batch
        timeout = settings.outbox_timeout_seconds
        self._own_client = client is None
        self.client = client or self._new_client()
        self._closed = False
        #: A send with no answer (status line and headers) this long after it left is given up
        #: (`_keep_held`): its hold is renewed no more, and an own client is closed to end it.
        self.send_deadline = timeout * _SEND_TIMEOUTS
        # Renews the hold of the row being sent (`_send_held`): one thread for the dispatcher's
        # life, not one per send.
        self._keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-hold")
        # A failed send's text is kept on the row, which viewers read (API, CLI, console): it is
        # masked as a log line is (a Slack-style webhook keeps its secret in the URL's path).
        self._secrets = secrets_of(settings)

    @property
    def _connect_timeout(self) -> float:
        return min(self.settings.outbox_timeout_seconds, 5.0)

    def _new_client(self) -> httpx.Client:
        import httpx

        timeout = self.settings.outbox_timeout_seconds
        return httpx.Client(
            timeout=httpx.Timeout(timeout, connect=self._connect_timeout), follow_redirects=False
        )

    @property
    def hold_seconds(self) -> float:
        timeout = self.settings.outbox_timeout_seconds
        return timeout + min(timeout, _HOLD_MARGIN_SECONDS)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Only the kinds with a configured endpoint are claimed; the rest wait for one."""
        return self.settings.outbox_kinds

    def run_once(self, stop: threading.Event | None = None) -> DispatchReport:
        """Claim and send until nothing is due (at most a few batches). Once `stop` is set, the
        rows of the batch not sent yet are given back, due at once for the next dispatcher."""
        report = DispatchReport()
        for _ in range(10):
            with self.db.transaction() as conn:
                rows = outbox_sending.claim_due(
                    conn,
                    self.kinds,
                    limit=self.batch,
                    hold_seconds=self.hold_seconds,
                )
            delivered = len(report.delivered)
            for index, row in enumerate(rows):
                if stop is not None and stop.is_set():
                    self._release(rows[index:])
                    return report
                # The rows of a batch are sent one after another: each row's claim is renewed
                # as it is posted (which records that it is being sent), and the rows after it,
                # waiting their turn, are held again with it and while its send lasts: another
                # dispatcher claiming them would count an attempt that this one never posts. A
                # row no longer this claim's (discarded, or taken once this dispatcher's store
                # was away) is skipped.
                waiting = rows[index + 1 :]
                if not self._start_send(row, waiting):
                    continue
                self._deliver(row, report, waiting)
            # A delivered webhook makes its task's next event due: go again while work flows.
            if len(rows) < self.batch and len(report.delivered) == delivered:
                break
        return report

    def run(self, stop: threading.Event) -> None:
        poll = self.settings.outbox_poll_seconds
        failures = 0
        while not stop.is_set():
            try:
                report = self.run_once(stop)
            except Exception as exc:  # the store briefly away must not end the loop
                # Each failure in a row doubles the wait (up to _MAX_BACKOFF_SECONDS): a store
                # that is down for an hour gets a round, and a log line, twice a minute.
                # The exponent is capped too: 2**1024 is past a float, and an outage of nine
                # hours is that many failures.
                failures += 1
                wait = min(poll * 2 ** min(failures, 64), max(poll, _MAX_BACKOFF_SECONDS))
                log.warning(
                    "outbox round failed (%s); retrying in %.0f s", type(exc).__name__, wait
                )
                stop.wait(wait)
                continue
            if failures:
                log.info("outbox round succeeded again after %d failure(s)", failures)
                failures = 0
            if not report.sent:
                stop.wait(poll)

    def close(self) -> None:
        # First the client: a send still under way in another thread (a stopping sweeper waits
        # for it only so long) ends with its connection, and so does the renewal of its hold.
        self._closed = True
        self.client.close()
        self._keeper.shutdown()

    def _release(self, rows: list[OutboxRow]) -> None:
        with self.db.transaction() as conn:
            for row in rows:
                outbox_sending.release_claim(conn, row)

    def _renew(self, row: OutboxRow, waiting: list[OutboxRow]) -> bool:
        with self.db.transaction() as conn:
            return outbox_sending.renew_claim(
                conn, row, hold_seconds=self.hold_seconds, waiting=waiting
            )

    def _start_send(self, row: OutboxRow, waiting: list[OutboxRow]) -> bool:
        with self.db.transaction() as conn:
            return outbox_sending.start_send(
                conn, row, hold_seconds=self.hold_seconds, waiting=waiting
            )

    def _deliver(self, row: OutboxRow, report: DispatchReport, waiting: list[OutboxRow]) -> None:
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        answer = self._send_held(row, waiting)
        error = answer.error
        if error is None:
            metrics.OUTBOX_DELIVERIES.inc()
        else:  # a dashboard tells a backend rate-limiting us from one failing
            (metrics.OUTBOX_THROTTLED if answer.throttled else metrics.OUTBOX_FAILURES).inc()
        with self.db.transaction() as conn:
            if error is None:
                delivered = outbox_sending.mark_delivered(conn, row.outbox_id)
                report.delivered.append(row.outbox_id)
                if delivered is not None and delivered.delivered_after_discard:
                    # The operator was told it is not sent (an action: "not sent"): say it.
                    log.warning(
                        "outbox %s (%s of task %s) was discarded by %r while a send was under "
                        "way, and the backend answered it 2xx: delivered after the discard "
                        "(the backend did act on it)",
                        row.outbox_id,
                        row.kind,
                        row.task_id,
                        delivered.discarded_by,
                    )
                return
            # This claim's attempt is the throttled one when the backend answered 429: it never
            # dead-letters (the backend is there, and asked for time).
            dead = answer.permanent or (
                row.kind == "webhook"
                and not answer.throttled
                and row.counted >= self.settings.webhook_max_attempts
            )
            delay = backoff_seconds(
                row.attempts,
                base=self.settings.outbox_backoff_seconds,
                maximum=self.settings.outbox_backoff_max_seconds,
                retry_after=answer.retry_after,
            )
            outbox_sending.mark_failed(
                conn,
                row,
                error,
                retry_at=utcnow() + timedelta(seconds=delay),
                dead=dead,
                throttled=answer.throttled,
            )
        if answer.throttled:
            report.throttled.append(row.outbox_id)
            # Information, not a warning: the backend is answering, and asked for time.
            log.info(
                "outbox %s (%s of task %s) attempt %d: %s; next attempt in %.0f s",
                row.outbox_id,
                row.kind,
                row.task_id,
                row.attempts,
                error,
                delay,
            )
            return
        (report.dead if dead else report.failed).append(row.outbox_id)
        log.warning(
            "outbox %s (%s of task %s) attempt %d failed: %s%s",
            row.outbox_id,
            row.kind,
            row.task_id,
            row.attempts,
            error,
            "; dead-lettered" if dead else "",
        )

    def _send_held(self, row: OutboxRow, waiting: list[OutboxRow]) -> _Answer:
        """`_send`, the row's hold renewed while the send lasts.

        The timeout bounds each read of the answer, not the whole send: a backend that trickles
        its status and headers (a byte within each timeout) keeps a send going past the hold.
        Another dispatcher would then claim the row and send the approval again while the
        backend still works on the first request. Renewed at a third of the hold, the row stays
        this dispatcher's while it is alive; one killed mid-send renews nothing, and the row is
        due again when its hold runs out. So are the rows of its batch `waiting` their turn.
        """
        done, gave_up = threading.Event(), threading.Event()
        keeping = self._keeper.submit(self._keep_held, row, waiting, done, gave_up)
        try:
            answer = self._send(row)
        finally:
            done.set()
            keeping.result()
        if not gave_up.is_set():
            return answer
        if not self._closed:
            self.client = self._new_client()  # the one closed to end the send
        if answer.error is None:
            return answer  # the answer came in as the send was given up: the backend took it
        return _Answer(
            f"no answer within {self.send_deadline:g} s (the backend was still sending its "
            "status line and headers); sent again later"
        )

    def _keep_held(
        self,
        row: OutboxRow,
        waiting: list[OutboxRow],
        done: threading.Event,
        gave_up: threading.Event,
    ) -> None:
        # The hold is renewed for a send that lasts, but not for ever: a backend that trickles
        # its headers without end would keep the row (and this dispatcher) for good.
        deadline = time.monotonic() + self.send_deadline
        while not done.wait(min(self.hold_seconds / 3, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                log.warning(
                    "outbox %s: no answer within %g s; the send is given up and retried later",
                    row.outbox_id,
                    self.send_deadline,
                )
                if self._own_client:  # ends the send (a client passed in is its owner's)
                    gave_up.set()
                    self.client.close()
                return  # renewed no more: the row is due again when its hold runs out
            try:
                if not self._renew(row, waiting):
                    return  # no longer this claim's (released, or recorded): nothing to hold
            except Exception as exc:  # the store briefly away: the next renewal may do
                log.warning(
                    "outbox %s: its hold was not renewed mid-send (%s)",
                    row.outbox_id,
                    type(exc).__name__,
                )

    def _timed_out(self, exc: httpx.TimeoutException) -> str:
        """What timed out, and the setting that bounds it: each of httpx's timeouts is a
        different trouble (a read timeout alone is a backend that does not answer in time)."""
        import httpx

        setting = f"ORCH_OUTBOX_TIMEOUT_SECONDS ({self.settings.outbox_timeout_seconds:g} s)"
        if isinstance(exc, httpx.ConnectTimeout):
            return f"timed out connecting (after {self._connect_timeout:g} s)"
        if isinstance(exc, httpx.WriteTimeout):
            # The backend (or a proxy before it) stopped reading the request: it never had it
            # whole, so this is not a slow answer, and raising the timeout rarely helps.
            return f"timed out sending: the backend took no more of the request within {setting}"
        if isinstance(exc, httpx.PoolTimeout):
            # Every connection of the client was busy with other sends: nothing was sent.
            return f"timed out waiting for a free connection (nothing sent) within {setting}"
        # Named with its setting: a backend that always answers later than this (it may well
        # take each request) dead-letters every webhook until the timeout is raised.
        return f"timed out: no answer within {setting}"

    def _send(self, row: OutboxRow) -> _Answer:
        """What the endpoint answered (never a secret in its error)."""
        import httpx

        body = row.body.encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            "X-Orchestrator-Delivery": str(row.outbox_id),
        }
        if row.kind == "action":
            url, secret = self.settings.actions_url, self.settings.actions_secret
            assert row.action_id is not None
            headers[IDEMPOTENCY_HEADER] = message_id = row.action_id
        else:
            url, secret = self.settings.webhook_url, self.settings.webhook_secret
            headers[EVENT_ID_HEADER] = message_id = f"{row.task_id}:{row.event_seq}"
        assert secret is not None  # the settings refuse a delivery URL without its secret
        # Signed at send time, each attempt anew: the timestamp is when this request left.
        headers.update(signature_headers(secret, message_id, body, timestamp=int(time.time())))
        assert url is not None  # only configured kinds are claimed
        try:
            # The status line and headers are the answer: the body is not read (however slowly
            # or long it follows, the backend already took the row), and the connection is
            # closed.
            with self.client.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                retry_after = response.headers.get("Retry-After")
        except httpx.TimeoutException as exc:
            return _Answer(self._timed_out(exc))
        except httpx.HTTPError as exc:
            text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return _Answer(redact(text, self._secrets)[:300])
        if 200 <= status < 300:
            return _Answer()
        if status in _UNAUTHORISED:
            # Most often a secret that is not the backend's (a rotation on one side only):
            # every delivery of the kind is refused the same way. Named, never shown.
            setting = "ORCH_ACTIONS_SECRET" if row.kind == "action" else "ORCH_WEBHOOK_SECRET"
            return _Answer(
                f"HTTP {status} ({REFUSAL}: the backend did not accept "
                f"the request's signature or credentials; check that it verifies with "
                f"{setting}, then retry)",
                permanent=True,
            )
        if is_permanent_refusal(status):
            return _Answer(f"HTTP {status} ({REFUSAL})", permanent=True)
        wait = None
        if status in RETRY_AFTER_STATUSES:
            wait = retry_after_seconds(retry_after, utcnow())
        if 300 <= status < 400:
            # A signed POST is not followed elsewhere: an http:// URL the backend moved to
            # https://, say. Retried as a failure, its error says what to mend.
            setting = "ORCH_ACTIONS_URL" if row.kind == "action" else "ORCH_WEBHOOK_URL"
            return _Answer(
                f"HTTP {status} (a redirect, not followed: set {setting} to the address the "
                "backend answers at)"
            )
        if status == THROTTLED:
            # Said on the row that viewers read: why this attempt did not bring it nearer to
            # being dead-lettered (an action is retried until a 2xx whatever the count).
            why = _THROTTLED_WEBHOOK if row.kind == "webhook" else "throttled"
            return _Answer(f"HTTP {status} ({why})", retry_after=wait, throttled=True)
        return _Answer(f"HTTP {status}", retry_after=wait)


class OutboxService:
    """What operators see and do: list deliveries or show one, retry or discard a dead-lettered
    one, hurry a failing one (a retry of a pending row)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def list(
        self,
        *,
        task_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int = 50,
    ) -> list[OutboxRow]:
        with self.db.transaction(readonly=True) as conn:
            return outbox_views.list_rows(
                conn, task_id=task_id, status=status, kind=kind, after_id=after_id, limit=limit
            )

    def listed(
        self,
        *,
        task_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int = 50,
    ) -> builtins.list[dict[str, Any]]:
        """`list` as operators read it: each row's public view, and a pending webhook held back
        in order says by what, its task's dead letter (`waits_behind`) or an earlier event
        failing and being retried (`waits_behind_retried`), read in the same transaction.
        NotFound for a `task_id` that names no task."""
        with self.db.transaction(readonly=True) as conn:
            rows = outbox_views.list_rows(
                conn, task_id=task_id, status=status, kind=kind, after_id=after_id, limit=limit
            )
            if not rows and task_id is not None:
                _require_task(conn, task_id)
            return outbox_views.held_views(conn, rows)

    def shown(self, outbox_id: int) -> dict[str, Any]:
        """One row as `listed` shows it (what it waits behind, why it is dead, who discarded
        it); NotFound for an id that names no row."""
        if outbox_id > MAX_OUTBOX_ID:
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction(readonly=True) as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            [view] = outbox_views.held_views(conn, [row])
        return view

    def retry(self, outbox_id: int, *, by: str, note: str | None = None) -> OutboxRow:
        """An operator's retry. A dead row is due again now with fresh counts; a pending one
        (failing, backing off) is due now, its counts kept: once the backend is mended it need
        not wait out its backoff. Refused (409) for a pending row a dispatcher is sending
        (`being_sent`: made due, a second dispatcher would send it at the same time) and for
        one held in order behind an earlier event of its task (`waits_behind`: that one is the
        one to retry); NotFound for an id that names no row. The row records who retried it,
        when, and `note` (`retried_by`, `retried_at`, `retry_note`), as a discard does."""
        if outbox_id > MAX_OUTBOX_ID:  # the column holds no larger id: none such exists
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction() as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            if row.status == "pending":
                _hurry(conn, row, by=by, note=note)
            elif not outbox_operator.retry_dead(conn, outbox_id, by=by, note=note):
                raise InvalidTransition(
                    f"outbox row {outbox_id} is {row.status}; only a dead or pending one can be "
                    "retried"
                )
            retried = outbox_views.get_row(conn, outbox_id)
        assert retried is not None
        log.info(
            "outbox %s (%s of task %s) retried by %r",  # typed text: quoted
            outbox_id,
            retried.kind,
            retried.task_id,
            by,
        )
        return retried

    def retry_all(
        self,
        *,
        by: str,
        note: str | None = None,
        kind: str | None = None,
        task_id: str | None = None,
    ) -> int:
        """Every dead-lettered delivery (of `kind`, of `task_id`) due again now, with fresh
        counts, each recording who retried it: how many. Once the backend (or a secret) is
        mended after it refused them all."""
        with self.db.transaction() as conn:
            count = outbox_operator.retry_all_dead(
                conn, kind=kind, task_id=task_id, by=by, note=note
            )
            if not count and task_id is not None:
                _require_task(conn, task_id)  # not "0 retried" for a mistyped task id
        if count:
            log.info("%d dead-lettered outbox row(s) are due again (retried by %r)", count, by)
        return count

    def retry_failing(
        self,
        *,
        by: str,
        note: str | None = None,
        kind: str | None = None,
        task_id: str | None = None,
    ) -> tuple[int, int]:
        """Every pending delivery (of `kind`, of `task_id`) that failed and waits out its
        backoff, due now with its counts kept, each recording who retried it: once the backend
        is mended after an outage. Those a dispatcher is sending are left to it: (made due,
        being sent)."""
        with self.db.transaction() as conn:
            hurried, sending = outbox_operator.hurry_all_pending(
                conn, kind=kind, task_id=task_id, by=by, note=note
            )
            if not (hurried or sending) and task_id is not None:
                _require_task(conn, task_id)  # not "0 due now" for a mistyped task id
        if hurried:
            log.info("%d failing outbox row(s) are due now (retried by %r)", hurried, by)
        return hurried, sending

    def discard(self, outbox_id: int, *, reason: str, by: str) -> OutboxRow:
        """Settle a delivery an operator dealt with by hand: never sent again, and its task's
        later events go on. A dead one, or a pending one no dispatcher has posted (one claimed
        in a dispatcher's batch, waiting its turn, too: the dispatcher re-checks it as its turn
        comes and does not post it): an action is retried until a 2xx, and one the backend
        answers 500 for every time (a bug on its side for that payload) was sent for ever.
        Refused (409 `being_sent`) once a dispatcher has posted it: its answer may yet deliver
        it. The row stays (who, when, why, and whether it
        was dead or pending) until retention deletes it; an approved action's row for good,
        saying its delivery was discarded, never delivered."""
        if outbox_id > MAX_OUTBOX_ID:
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction() as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            if not outbox_operator.discard(conn, outbox_id, by=by, reason=reason):
                # Read again: on Postgres the discard waited for a claim being written.
                current = outbox_views.get_row(conn, outbox_id) or row
                if current.being_sent(utcnow()):
                    raise _being_sent(current, "discard it then if it failed")
                raise InvalidTransition(
                    f"outbox row {outbox_id} is {current.status}; only a dead or pending one "
                    "can be discarded"
                )
            discarded = outbox_views.get_row(conn, outbox_id)
        assert discarded is not None
        log.info(
            "outbox %s (%s of task %s, %s) discarded by %r: %r",  # typed text: one line, quoted
            outbox_id,
            discarded.kind,
            discarded.task_id,
            discarded.discarded_from,
            by,
            reason,
        )
        return discarded

    def summary(self, task_id: str) -> dict[str, Any]:
        with self.db.transaction(readonly=True) as conn:
            return outbox_views.delivery_summary(conn, task_id)


def _hurry(conn: Connection, row: OutboxRow, *, by: str, note: str | None) -> None:
    """Make the pending `row` due now, or say why not: a dispatcher is sending it, or it waits
    in order behind an earlier event of its task (made due, it would still wait)."""
    held = outbox_views.waits_behind(conn, [row]).get(row.outbox_id)
    if held is not None:
        status, head = held
        what, action = (
            ("a dead letter", "retry or discard")
            if status == "dead"
            else ("an earlier event being retried", "retry")
        )
        raise ConflictError(
            f"outbox row {row.outbox_id} waits behind outbox {head}, {what} of its task "
            f"(events go in order): {action} that one, and this one follows it",
            code="waits_behind",
        )
    if outbox_operator.hurry_pending(conn, row.outbox_id, by=by, note=note):
        return
    # Claimed as it was read or meanwhile (a retry waits for a claim being written): read
    # again for what the claim holds.
    current = outbox_views.get_row(conn, row.outbox_id)
    if current is None:  # the cleanup deleted it meanwhile (never attempted, nothing sends it)
        raise NotFound(f"outbox row {row.outbox_id} does not exist")
    if current.status == "dead" and outbox_operator.retry_dead(
        conn, row.outbox_id, by=by, note=note
    ):
        return  # its attempt ended meanwhile, dead-lettered: retried as a dead one is
    if current.status != "pending":
        raise InvalidTransition(
            f"outbox row {row.outbox_id} is {current.status}; only a dead or pending one can "
            "be retried"
        )
    raise _being_sent(current, "retry it then if it failed")


def _being_sent(row: OutboxRow, then: str) -> ConflictError:
    """409 `being_sent` for an operator's retry or discard of a row a dispatcher holds: posted
    or waiting its turn in the dispatcher's batch, until when, and what to do once its answer
    is recorded."""
    until = f", held until {row.claimed_until:%Y-%m-%dT%H:%M:%S}Z" if row.claimed_until else ""
    what = (
        "is being sent now"
        if row.posting(utcnow())
        else "is claimed by a dispatcher and waits its turn in the batch it sends"
    )
    # Only a retry is refused for a row waiting its turn (a discard settles it): made due, a
    # second dispatcher would post it beside the first, and it is about to be posted anyway.
    soon = (
        ""
        if row.posting(utcnow())
        else "; it is posted when its turn comes: a retry would not send it sooner"
    )
    return ConflictError(
        f"outbox row {row.outbox_id} {what} (attempt {row.attempts}{until}){soon}; "
        f"its answer is recorded when the attempt ends: {then}",
        code="being_sent",
    )


def _require_task(conn: Connection, task_id: str) -> None:
    """NotFound unless the task exists: an empty answer for a mistyped (or cut short) task id
    read as a task with nothing to deliver (`outbox list --task`, `GET /api/v1/outbox?task_id`,
    `retry-dead` with a `task_id`), not as the mistake it is."""
    if task_store.get_task(conn, task_id) is None:
        raise NotFound(f"task {echoed(task_id)} does not exist")
