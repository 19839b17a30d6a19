"""Plan wake-ups: Redis pub/sub across clients, same-process wake-ups, and the SSE generator."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.api.stream import _events
from orchestrator.errors import NotFound
from orchestrator.events import PlanHub, RedisNotifier
from orchestrator.services.plans import PlanService
from orchestrator.services.sessions import SessionService
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger


def test_a_redis_publish_wakes_a_subscriber_long_before_the_poll(redis_url: str) -> None:
    async def scenario() -> tuple[bool, float, bool]:
        hub = PlanHub(redis_url, poll_seconds=30)
        await hub.start()
        notifier = RedisNotifier(redis_url)
        try:
            await asyncio.wait_for(hub.subscribed.wait(), 10)
            with hub.subscribe("s1") as mine, hub.subscribe("s2") as other:
                started = time.monotonic()
                await asyncio.to_thread(notifier.notify, "s1", 1)
                woken = await mine.wait(10)
                elapsed = time.monotonic() - started
                other_woken = await other.wait(0.3)
            return woken, elapsed, other_woken
        finally:
            notifier.close()
            await hub.stop()

    woken, elapsed, other_woken = asyncio.run(scenario())
    assert woken
    assert elapsed < 2
    assert not other_woken


def test_a_wake_up_before_the_wait_is_not_lost() -> None:
    async def scenario() -> bool:
        hub = PlanHub(None, poll_seconds=30)
        await hub.start()
        try:
            with hub.subscribe("s") as subscription:
                subscription.clear()
                await asyncio.to_thread(hub.notify, "s", 1)  # from another thread, before waiting
                return await subscription.wait(2)
        finally:
            await hub.stop()

    assert asyncio.run(scenario())


def test_stream_sends_state_revisions_and_keep_alives(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
    body = {"request_id": "r1", "title": "p", "nodes": [
        {"id": "a", "title": "a", "actor": "agent", "status": "pending"}]}  # fmt: skip

    async def scenario() -> list[bytes]:
        await hub.start()
        chunks: list[bytes] = []
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.3)
        try:
            chunks.append(await anext(stream))
            await asyncio.to_thread(plans.publish_execution_plan, session_id, body)
            chunks.append(await anext(stream))
            chunks.append(await anext(stream))  # idle: a keep-alive comment comes next
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        state, plan, keepalive = asyncio.run(scenario())
    finally:
        db.dispose()
    assert state.startswith(b"event: state\n")
    assert plan.startswith(b"event: execution_plan\nid: 1\ndata: {")
    assert keepalive == b": keep-alive\n\n"


def test_an_event_id_from_elsewhere_resumes_from_the_newest_revision(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
    node = {"id": "a", "title": "a", "actor": "agent", "status": "pending"}

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), 99, keepalive=5)
        try:
            chunks = [await anext(stream)]
            body = {"request_id": "r1", "title": "p", "nodes": [node]}
            await asyncio.to_thread(plans.publish_execution_plan, session_id, body)
            chunks.append(await asyncio.wait_for(anext(stream), 5))
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        _, first = asyncio.run(scenario())
    finally:
        db.dispose()
    assert first.startswith(b"event: execution_plan\nid: 1\n")


def test_a_deleted_sessions_stream_ends_and_a_new_connection_is_404(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.2)
        chunks: list[bytes] = []
        try:
            chunks.append(await anext(stream))
            chunks.append(await asyncio.wait_for(anext(stream), 5))  # a keep-alive: it lives
            await asyncio.to_thread(ReceiptLedger(db).delete_session, session_id)
            async with asyncio.timeout(5):  # not keep-alives forever: the stream ends
                chunks += [chunk async for chunk in stream]
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        chunks = asyncio.run(scenario())
        with pytest.raises(NotFound):
            plans.state(session_id)  # what a new connection asks first: a 404
    finally:
        db.dispose()
    assert chunks[0].startswith(b"event: state\n")
    assert chunks[1] == b": keep-alive\n\n"
    assert len(chunks) <= 3  # at most one more keep-alive before the session was found gone
