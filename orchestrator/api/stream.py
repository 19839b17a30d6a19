"""The live plan stream (SSE) of seed 004: `state` first, then one `execution_plan` per revision.

The store is read for every revision above the last one sent, so only committed revisions are
shown, each once per connection, and `Last-Event-ID: n` replays from n + 1. A first connection's
`state` carries the id of the newest revision it shows (seed 004: the saved plans), so a browser
that reconnects says what it has seen.

The stream ends when nothing more can be written to its session: when the session is deleted
(a new connection is a 404), and when an execution's session is finished, because its task is
final or a newer generation writes to a session of its own (`store.plans.session_standing`: an
earlier generation's session whose plan is still the task's latest, with a human node open,
takes a person's step until the newer one publishes); the revisions committed before that are
sent first. An `EventSource` reconnects to an ended stream for as long as the answer is a 200,
so a reconnect that has seen a finished session's newest revision is a 204, which stops it.
Chats and collaborations never finish. An operator's requeue of a final task makes the session
of its last plan take a person's steps again (until the new generation publishes); a client
stopped by the 204 learns of the requeue as of any change to a final task (the task's view, or
the task stream opened again, which relays the steps) and a new connection here is a 200. The
204 is kept: a 200 for every final task's last session, in case of a requeue, would keep its
browser reconnecting, or an idle connection open, for a change that may never come.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool

from orchestrator.api.auth import still_admitted
from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_hub, get_plans
from orchestrator.api.plan_views import plan_as_sent
from orchestrator.api.sessions import readable_session
from orchestrator.events import PlanHub
from orchestrator.services.plans import PlanService, SessionPlans

__all__ = [
    "KEEPALIVE_EVENT",
    "StoreOutage",
    "keepalive_event",
    "last_event_id_of",
    "router",
    "sse_event",
    "while_admitted",
]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1/agent/chat/session", tags=["stream"])

_BATCH = 100
#: How often an open stream reads again while the store is away (at most; less with a shorter
#: keep-alive).
OUTAGE_RETRY_SECONDS: Final = 1.0
#: How often an open stream asks whether its caller's account still holds (at most; the
#: keep-alive, which goes out while no event does, bounds it from the other side).
ADMISSION_CHECK_SECONDS: Final = 1.0

#: The name of the keep-alive event (`keepalive_event`).
KEEPALIVE_EVENT: Final = "keepalive"

T = TypeVar("T")


class StoreOutage:
    """One open stream's reads through a store outage: a read the store cannot answer is None
    (the caller keeps the stream alive and reads again), logged once per outage."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._since: float | None = None

    @property
    def away(self) -> bool:
        return self._since is not None

    async def read(self, read: Callable[..., T], *args: Any) -> T | None:
        try:
            value = await run_in_threadpool(read, *args)
        except (OperationalError, PoolTimeout) as exc:
            if self._since is None:
                self._since = time.monotonic()
                cause = getattr(exc, "orig", None) or exc
                first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
                log.warning(
                    "%s: the store is unavailable (%s); the stream stays open and reads again",
                    self.what,
                    first,
                )
            return None
        if self._since is not None:
            log.info(
                "%s: the store answers again after %.1f s; the stream goes on",
                self.what,
                time.monotonic() - self._since,
            )
            self._since = None
        return value


def sse_event(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One SSE message; the JSON is on one line, so it is one `data:` field."""
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def keepalive_event(every: float) -> bytes:
    """The keep-alive of an idle stream: a named event, `keepalive`, with no id (a browser's
    `Last-Event-ID` stays the last real event's). It was an SSE comment, which an `EventSource`
    never surfaces, so a page could not tell a quiet stream from an API that stopped answering
    and showed it live. Its data, as the `state` event's `keepalive_seconds`, says how often
    one comes; a client that listens only for the other events (or `onmessage`) never sees it."""
    return sse_event(KEEPALIVE_EVENT, {"keepalive_seconds": every})


async def while_admitted(
    request: Request, chunks: AsyncIterator[bytes], every: float = ADMISSION_CHECK_SECONDS
) -> AsyncIterator[bytes]:
    """`chunks` for as long as the caller's credentials still hold (`auth.still_admitted`),
    asked before a chunk goes out, at most once per `every` seconds: the keep-alives bound how
    long a stream whose account was taken away goes on. It then ends; the `EventSource`'s
    reconnect is a 401, which stops it."""
    checked = time.monotonic()
    try:
        async for chunk in chunks:
            if time.monotonic() - checked >= every:
                if not still_admitted(request):
                    return
                checked = time.monotonic()
            yield chunk
    finally:
        closing = getattr(chunks, "aclose", None)
        if closing is not None:
            await closing()


def last_event_id_of(raw: str | None) -> int | None:
    """The `Last-Event-ID` a client sent, or None for a first connection (or not one of ours)."""
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None  # not one of ours: behave as a first connection
    return value if value >= 0 else None


async def _events(
    plans: PlanService,
    hub: PlanHub,
    state: SessionPlans,
    after: int | None,
    keepalive: float,
) -> AsyncIterator[bytes]:
    session_id = state.session_id
    latest = state.latest
    snapshot = {
        "session_id": session_id,
        "running": state.running,
        "execution_plans": [plan_as_sent(latest.to_dict())] if latest else [],
        # How long this stream may be silent: a page knows it from the first event.
        "keepalive_seconds": keepalive,
    }
    newest = state.newest
    # A first connection's snapshot carries the id it is current to; a resumed one's does not
    # (the revisions after the client's id follow, and must not be skipped on the next resume).
    yield sse_event("state", snapshot, newest if after is None else None)
    # An id above the newest revision is not one of ours (revisions are never removed): resume
    # from the newest rather than stay silent until the session catches up with it.
    last = newest if after is None else min(after, newest)
    # Known before a read: every revision the session will ever hold has committed by then,
    # so the read after it is the last one.
    finished = state.finished
    sent_at = time.monotonic()
    outage = StoreOutage(f"plan stream of session {session_id}")
    with hub.subscribe(session_id) as subscription:
        while True:
            subscription.clear()  # before reading: a wake-up during the read is kept
            records = await outage.read(plans.revisions_after, session_id, last, _BATCH)
            if records is None:
                if time.monotonic() - sent_at >= keepalive:
                    yield keepalive_event(keepalive)
                    sent_at = time.monotonic()
                await subscription.wait(min(keepalive, OUTAGE_RETRY_SECONDS))
                continue
            for record in records:
                yield sse_event("execution_plan", plan_as_sent(record.to_dict()), record.revision)
                last = record.revision
                sent_at = time.monotonic()
            if len(records) == _BATCH:
                continue
            if finished:
                return
            idle = time.monotonic() - sent_at
            if idle >= keepalive:
                # A deleted session (chat retention) or a finished one gets no more revisions:
                # end the stream rather than keep it alive forever, once what committed before
                # is sent (one more read). Looked at once per keep-alive, not on every wake-up.
                takes_writes = await outage.read(plans.takes_writes, session_id)
                if takes_writes is False:  # None: the store is away, read again later
                    finished = True
                    continue
                yield keepalive_event(keepalive)
                sent_at = time.monotonic()
                idle = 0.0
            await subscription.wait(keepalive - idle)


@router.get(
    "/{session_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {"description": "server-sent events", "content": {"text/event-stream": {}}},
        204: {"description": "the session is finished and the client has seen its newest revision"},
        **error_responses(403, 404),
    },
    dependencies=[Depends(readable_session)],
)
async def plan_stream(
    session_id: str,
    request: Request,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
    plans: PlanService = Depends(get_plans),
    hub: PlanHub = Depends(get_hub),
) -> Response:
    """`text/event-stream` of the session's plan; an unknown session is a 404 before streaming,
    a reconnect that has seen a finished session's newest revision a 204."""
    state = await run_in_threadpool(plans.state, session_id)
    after = last_event_id_of(last_event_id)
    if after is not None and state.finished and after >= state.newest:
        return Response(status_code=204)
    keepalive = float(request.app.state.keepalive_seconds)
    return StreamingResponse(
        while_admitted(request, _events(plans, hub, state, after, keepalive)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
