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

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Final

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
from orchestrator.store import outbox_sending
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
    "sign",
]

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
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
