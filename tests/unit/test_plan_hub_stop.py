"""PlanHub.stop() ends however its listener treats a cancel (redis-py has swallowed a cancel
that lands while it connects: redis/redis-py#2551, #2028), so an API stop never hangs on it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

from orchestrator.events import PlanHub


async def _stop_with(listener_body: Callable[[], Awaitable[None]]) -> tuple[float, bool]:
    hub = PlanHub()
    await hub.start()
    task = asyncio.create_task(listener_body())
    hub._listener = task
    await asyncio.sleep(0.01)
    started = time.monotonic()
    await hub.stop()
    return time.monotonic() - started, task.done()


def test_a_listener_that_swallows_one_cancel_is_cancelled_again() -> None:
    swallowed = []

    async def swallows_once() -> None:
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(1)

    took, done = asyncio.run(_stop_with(swallows_once))
    assert done
    assert swallowed == [1]
    assert took < 2


def test_a_listener_that_never_ends_is_given_up_on_in_bounded_time() -> None:
    released = threading.Event()  # lets the loop's own shutdown end the task after the test

    async def deaf_to_cancel() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    async def scenario() -> tuple[float, bool]:
        try:
            return await _stop_with(deaf_to_cancel)
        finally:
            released.set()

    took, done = asyncio.run(scenario())
    assert not done
    assert took < 5


def test_a_hub_started_again_after_a_stop_listens_again() -> None:
    """An app's lifespan may run twice (a test client entered twice): the second start must
    listen, not end at once because the first stop said so."""

    async def scenario() -> tuple[bool, bool]:
        hub = PlanHub("redis://127.0.0.1:1/0")  # nothing listens: the listener keeps retrying
        await hub.start()
        await hub.stop()
        await hub.start()
        await asyncio.sleep(0.1)
        listener = hub._listener
        listening = listener is not None and not listener.done()
        await hub.stop()
        return listening, listener is not None and listener.done()

    listening, ended = asyncio.run(scenario())
    assert listening
    assert ended
