"""The live plan stream (SSE) of seed 004: `state` first, then one `execution_plan` per revision.

The store is read for every revision above the last one sent, so only committed revisions are
shown, each once per connection, and `Last-Event-ID: n` replays from n + 1. The stream ends when
its session is deleted; a new connection to it is a 404.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_hub, get_plans
from orchestrator.events import PlanHub
from orchestrator.services.plans import PlanService, SessionPlans

__all__ = ["last_event_id_of", "router", "sse_event"]

router = APIRouter(prefix="/api/v1/agent/chat/session", tags=["stream"])

_BATCH = 100


def sse_event(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One SSE message; the JSON is on one line, so it is one `data:` field."""
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


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
        "execution_plans": [latest.to_dict()] if latest else [],
    }
    yield sse_event("state", snapshot)
    newest = latest.revision if latest else 0
    # An id above the newest revision is not one of ours (revisions are never removed): resume
    # from the newest rather than stay silent until the session catches up with it.
    last = newest if after is None else min(after, newest)
    sent_at = time.monotonic()
    with hub.subscribe(session_id) as subscription:
        while True:
            subscription.clear()  # before reading: a wake-up during the read is kept
            records = await run_in_threadpool(plans.revisions_after, session_id, last, _BATCH)
            for record in records:
                yield sse_event("execution_plan", record.to_dict(), record.revision)
                last = record.revision
                sent_at = time.monotonic()
            if len(records) == _BATCH:
                continue
            idle = time.monotonic() - sent_at
            if idle >= keepalive:
                # A deleted session (chat retention) gets no more revisions: end the stream
                # rather than keep it alive forever; the browser's reconnect gets a 404, which
                # stops it. Looked at once per keep-alive, not on every wake-up.
                if not await run_in_threadpool(plans.session_exists, session_id):
                    return
                yield b": keep-alive\n\n"
                sent_at = time.monotonic()
                idle = 0.0
            await subscription.wait(keepalive - idle)


@router.get(
    "/{session_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {"description": "server-sent events", "content": {"text/event-stream": {}}},
        **error_responses(404),
    },
)
async def plan_stream(
    session_id: str,
    request: Request,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
    plans: PlanService = Depends(get_plans),
    hub: PlanHub = Depends(get_hub),
) -> StreamingResponse:
    """`text/event-stream` of the session's plan; an unknown session is a 404 before streaming."""
    state = await run_in_threadpool(plans.state, session_id)
    keepalive = float(request.app.state.keepalive_seconds)
    return StreamingResponse(
        _events(plans, hub, state, last_event_id_of(last_event_id), keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
