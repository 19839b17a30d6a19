"""The task stream (SSE): `GET /api/v1/tasks/{task_id}/stream`, following every generation.

A `state` snapshot first (status, generation, current plan, pending actions), then the task's
event log in commit order: `execution_plan` for each revision of the generation running,
`status` for each change (`queued` for a new generation, `waiting`, and the final ones),
`action_proposed`, `action_decided`, `action_superseded` and `action_task_cancelled`. Every
event's id is the task's durable `seq`, so `Last-Event-ID: n` resumes at n + 1, also after an
API restart. The stream ends after a final status (`completed`, `failed`, `cancelled`).

An `EventSource` reconnects a few seconds after any stream ends, with the last id it saw, and
keeps doing so for as long as the answer is a 200; a 204 is what stops it (the HTML SSE rules).
So a reconnect to a finished task that has seen its last event is answered 204, no body; a
first connection (no `Last-Event-ID`) still gets the `state` snapshot, which shows the plan a
finished task ended with (seed 004: the first `state` carries the saved plans).

A store outage while the stream is open does not end it (`api.stream.StoreOutage`): it keeps
the connection alive and goes on from its last id when the store answers again.

An idle stream reads the store only when it must. While the API's Redis subscription is live,
every commit of an event of the task wakes the stream, so its read without a wake-up is only
the safety net for one lost on the way: the hub's poll (`events.REDIS_POLL_SECONDS`, 5 s).
Read every `ORCH_TASK_STREAM_POLL_SECONDS` (1 s) regardless, 400 open console tabs were 400
store reads a second for nothing. Without Redis, or while its subscription is down, no wake-up
comes from another process and that setting's poll is the only way to see its events.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_db
from orchestrator.api.explain_views import payload_as_sent
from orchestrator.api.plan_views import plan_as_sent
from orchestrator.api.stream import (
    OUTAGE_RETRY_SECONDS,
    StoreOutage,
    keepalive_event,
    last_event_id_of,
    sse_event,
    while_admitted,
)
from orchestrator.domain.times import wire_time
from orchestrator.events import PlanHub
from orchestrator.services.task_stream import TaskSnapshot, TaskStreamService
from orchestrator.store.db import Database
from orchestrator.store.task_events import task_wake_key

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/tasks", tags=["stream"])

_BATCH = 100


def _as_sent(data: dict[str, Any]) -> Any:
    """An event's data as the read routes send its parts: a plan's node or edge, or a pending
    action's payload, that an older version stored in another shape is its JSON text. A time
    (a pending action's `created_at`) goes out as `wire_time`, as the read routes send it."""
    out = dict(data)
    if isinstance(out.get("plan"), dict):
        out["plan"] = plan_as_sent(out["plan"])
    if isinstance(out.get("pending_actions"), list):
        out["pending_actions"] = [
            {**action, "payload": payload_as_sent(action.get("payload"))}
            for action in out["pending_actions"]
        ]
    return jsonable_encoder(out, custom_encoder={datetime: wire_time})


async def _events(
    service: TaskStreamService,
    hub: PlanHub,
    task_id: str,
    snapshot: TaskSnapshot,
    after: int | None,
    keepalive: float,
    poll: float,
) -> AsyncIterator[bytes]:
    # A first connection's snapshot carries the id it is current to; a resumed one's does not
    # (the events after the client's id follow, and must not be skipped on the next resume).
    first = after is None
    # How long this stream may be silent (`stream.keepalive_event`): known from the first event.
    state = {**_as_sent(snapshot.data), "keepalive_seconds": keepalive}
    yield sse_event("state", state, snapshot.last_seq if first else None)
    # An id above the newest is not one of ours (the log is never trimmed): resume at the newest.
    last = snapshot.last_seq if after is None else min(after, snapshot.last_seq)
    sent_at = time.monotonic()
    # Woken when a process commits an event of this task (over Redis from workers and other
    # API processes); the poll is the safety net for a wake-up lost on the way, or the only way
    # when none can come (`_wait_for_more`).
    outage = StoreOutage(f"task stream of task {task_id}")
    with hub.subscribe(task_wake_key(task_id)) as subscription:
        while True:
            subscription.clear()  # before reading: a wake-up during the read is kept
            events = await outage.read(service.events_after, task_id, last, _BATCH)
            if events is None:  # the store is away: keep the client, read again
                if time.monotonic() - sent_at >= keepalive:
                    yield keepalive_event(keepalive)
                    sent_at = time.monotonic()
                await subscription.wait(min(keepalive, OUTAGE_RETRY_SECONDS))
                continue
            for event in events:
                yield sse_event(event.name, _as_sent(event.data), event.seq)
                last = event.seq
                sent_at = time.monotonic()
                if event.final:
                    return
            if len(events) == _BATCH:
                continue
            if snapshot.final and not events:
                return  # finished before the stream opened, and nothing follows
            idle = time.monotonic() - sent_at
            if idle >= keepalive:
                yield keepalive_event(keepalive)
                sent_at = time.monotonic()
                idle = 0.0
            await subscription.wait(_wait_for_more(hub, poll, keepalive - idle))


def _wait_for_more(hub: PlanHub, poll: float, until_keepalive: float) -> float:
    """How long an idle stream waits for a wake-up before it reads the store anyway.

    With the hub's Redis subscription live, until the keep-alive is due: `Subscription.wait`
    stops at the hub's safety-net poll first. Otherwise (no Redis, or its subscription down
    and wake-ups from other processes lost meanwhile) every `poll` seconds, the setting."""
    live = hub.redis_url is not None and hub.subscribed.is_set()
    return max(0.01, until_keepalive if live else min(poll, until_keepalive))


@router.get(
    "/{task_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the task's events"},
        204: {"description": "the task is finished and the client has seen its last event"},
        **error_responses(404),
    },
)
async def task_stream(
    task_id: str,
    request: Request,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
    db: Database = Depends(get_db),
) -> Response:
    """`text/event-stream` of one task across its generations; an unknown task is a 404, a
    reconnect that has seen a finished task's last event a 204."""
    service = TaskStreamService(db)
    hub: PlanHub = request.app.state.hub
    snapshot = await run_in_threadpool(service.snapshot, task_id)
    after = last_event_id_of(last_event_id)
    if after is not None and await run_in_threadpool(
        service.finished_after, snapshot, task_id, after
    ):
        return Response(status_code=204)
    keepalive = float(request.app.state.keepalive_seconds)
    poll = float(request.app.state.settings.task_stream_poll_seconds)
    return StreamingResponse(
        while_admitted(request, _events(service, hub, task_id, snapshot, after, keepalive, poll)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
