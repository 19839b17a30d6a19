"""Wake-ups across processes: a committed plan revision wakes the streams that watch its
session, and a committed task event (`task:ID`, see `store.task_events.task_wake_key`) the task
streams that follow that task.

The store is the event log: a stream sends the revisions above the last one it sent, so nothing
uncommitted is ever shown, a reconnect replays from `Last-Event-ID`, and a lost wake-up only
delays an event. Wake-ups travel over Redis pub/sub when Redis is configured; in embedded mode
streams poll the store (which every process shares) and same-process publishes wake them at once.
redis-py is imported by the Redis side alone: an embedded process (an operator's command) never
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Final, Protocol

from orchestrator.leases.keys import PLAN_CHANNEL_PREFIX
from orchestrator.settings import Settings

__all__ = [
    "PLAN_CHANNEL_PREFIX",
    "CompositeNotifier",
    "NullNotifier",
    "PlanHub",
    "PlanNotifier",
    "RedisNotifier",
    "Subscription",
    "make_notifier",
]

log = logging.getLogger(__name__)

EMBEDDED_POLL_SECONDS: Final = 0.5
# With Redis a poll is only the safety net for a wake-up lost while a subscriber reconnected.
REDIS_POLL_SECONDS: Final = 5.0


class PlanNotifier(Protocol):
    """Told once after a revision committed; must never raise (the write already happened)."""

    def notify(self, session_id: str, revision: int) -> None: ...

    def wake_keys(self, keys: Collection[str]) -> None:
        """Told the keys a committed unit of work marked (`Database.after_commit`)."""
        ...


class NullNotifier:
    """Embedded processes without streams: the pollers of other processes find the revision."""

    def notify(self, session_id: str, revision: int) -> None:
        return None

    def wake_keys(self, keys: Collection[str]) -> None:
        return None


class RedisNotifier:
    """Publishes a wake-up on the session's channel; a Redis failure is logged, not raised."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    def notify(self, session_id: str, revision: int) -> None:
        import redis

        try:
            self._client.publish(f"{PLAN_CHANNEL_PREFIX}{session_id}", str(revision))
        except redis.RedisError as exc:
            log.warning("plan wake-up for session %s not published: %s", session_id, exc)

    def wake_keys(self, keys: Collection[str]) -> None:
        """One round trip however many keys (a sweep's batch of requeues is pipelined)."""
        import redis

        try:
            if len(keys) == 1:  # most commits: a pipeline would cost more than it saves
                (key,) = keys
                self._client.publish(f"{PLAN_CHANNEL_PREFIX}{key}", "1")
                return
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.publish(f"{PLAN_CHANNEL_PREFIX}{key}", "1")
            pipe.execute()
        except redis.RedisError as exc:
            # Not a task's wake-up (the broker's, `services/dispatch.py`): said apart, since an
            # operator in a Redis outage reads "wake-ups not published" as tasks left unwoken.
            log.warning(
                "%d change notice(s) for streams and running rounds not published over Redis "
                "(%s); streams see the change at their next poll, a round ended elsewhere stops "
                "at its next lease renewal",
                len(keys),
                exc,
            )

    def close(self) -> None:
        self._client.close()


class CompositeNotifier:
    """Tells several notifiers, in order."""

    def __init__(self, notifiers: Sequence[PlanNotifier]) -> None:
        self._notifiers = tuple(notifiers)

    def notify(self, session_id: str, revision: int) -> None:
        for notifier in self._notifiers:
            notifier.notify(session_id, revision)

    def wake_keys(self, keys: Collection[str]) -> None:
        for notifier in self._notifiers:
            notifier.wake_keys(keys)


def make_notifier(settings: Settings) -> PlanNotifier:
    """The notifier a publishing process (a worker, the CLI) uses under `settings`."""
    if settings.redis_url:
        return RedisNotifier(settings.redis_url)
    return NullNotifier()


class Subscription:
    """One stream's wake-up flag; it stays set until cleared, so a wake-up is never missed."""

    def __init__(self, poll_seconds: float) -> None:
        self.event = asyncio.Event()
        self.poll_seconds = poll_seconds

    def clear(self) -> None:
        self.event.clear()

    async def wait(self, at_most: float) -> bool:
        """Until woken or min(at_most, poll interval) passed; True when woken."""
        try:
            async with asyncio.timeout(max(0.0, min(at_most, self.poll_seconds))):
                await self.event.wait()
        except TimeoutError:
            return False
        return True


#: How often and how long `PlanHub.stop` cancels a listener that has not ended.
_STOP_TRIES: Final = 4
_STOP_WAIT: Final = 0.5


class PlanHub:
    """The waiting side, one per API process: streams wait here for their session's wake-up."""

    def __init__(self, redis_url: str | None = None, poll_seconds: float | None = None) -> None:
        self.redis_url = redis_url
        default = REDIS_POLL_SECONDS if redis_url else EMBEDDED_POLL_SECONDS
        self.poll_seconds = poll_seconds if poll_seconds is not None else default
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()
        self._stopping = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = False  # a stop ended the previous listener; this one listens
        if self.redis_url:
            self._listener = asyncio.create_task(self._listen(self.redis_url))

    async def stop(self) -> None:
        """Cancel the listener, again if a cancel was swallowed (redis-py has lost one that
        landed while it connected: redis/redis-py#2551), for at most `_STOP_TRIES` x
        `_STOP_WAIT` seconds: a stop never hangs on it."""
        self._stopping = True
        listener, self._listener = self._listener, None
        if listener is not None:
            for _ in range(_STOP_TRIES):
                listener.cancel()
                done, _pending = await asyncio.wait({listener}, timeout=_STOP_WAIT)
                if done:
                    if not listener.cancelled():
                        listener.exception()  # retrieved: an ending error is no stop's concern
                    break
            else:
                log.warning("plan wake-up listener did not stop; leaving it")
        self.wake_all()

    def notify(self, session_id: str, revision: int) -> None:
        """A `PlanNotifier` for publishes made in this process (from any thread)."""
        self.wake(session_id)

    def wake(self, session_id: str) -> None:
        self.wake_keys((session_id,))

    def wake_keys(self, keys: Collection[str]) -> None:
        """A `PlanNotifier` for commits made in this process (from any thread)."""
        with self._lock:
            events = [event for key in keys for event in self._waiters.get(key, ())]
        self._set(events)

    def wake_all(self) -> None:
        with self._lock:
            events = [event for group in self._waiters.values() for event in group]
        self._set(events)

    def _set(self, events: list[asyncio.Event]) -> None:
        loop = self._loop
        if not events or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for event in events:
            if running is loop:
                event.set()
            else:
                loop.call_soon_threadsafe(event.set)

    @contextlib.contextmanager
    def subscribe(self, session_id: str) -> Iterator[Subscription]:
        """Register for the session's wake-ups; clear, read the store, then wait: none is lost."""
        subscription = Subscription(self.poll_seconds)
        with self._lock:
            self._waiters.setdefault(session_id, set()).add(subscription.event)
        try:
            yield subscription
        finally:
            with self._lock:
                group = self._waiters.get(session_id)
                if group is not None:
                    group.discard(subscription.event)
                    if not group:
                        del self._waiters[session_id]

    async def _listen(self, url: str) -> None:
        import redis.asyncio as aioredis

        backoff = 0.2
        while not self._stopping:
            client = aioredis.Redis.from_url(url)
            pubsub = client.pubsub()
            try:
                await pubsub.psubscribe(f"{PLAN_CHANNEL_PREFIX}*")
                self.subscribed.set()
                self.wake_all()  # anything published while we were not subscribed
                backoff = 0.2
                async for message in pubsub.listen():
                    if message.get("type") != "pmessage":
                        continue
                    channel = message["channel"]
                    if isinstance(channel, bytes):
                        channel = channel.decode("utf-8", "replace")
                    self.wake(str(channel).removeprefix(PLAN_CHANNEL_PREFIX))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any Redis trouble: streams fall back to polling meanwhile
                self.subscribed.clear()
                log.warning("plan wake-up subscription lost (%s); retrying", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    # redis-py before 8.2 left aclose untyped; 8.2 types it.
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
                with contextlib.suppress(Exception):
                    await client.aclose()
