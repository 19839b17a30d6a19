"""A worker hears at once that a generation it runs was ended elsewhere.

A cancel, an operator requeue or a sweep that found the generation lost ends it in the store and,
once that committed, publishes `ended:<task_id>` (`leases.keys.ended_key`, sent by the process's
notifier like every wake-up). Each worker process keeps one Redis subscription, to the channels
of the tasks whose generations it runs; a message makes the lease heartbeat renew and mirror that
lease at once, and the store's answer ("this generation is over") stops the round then, instead
of at the next renewal (up to ORCH_LEASE_RENEW_SECONDS later), even while it waits on the model.

A lost message only delays the stop until that renewal: the heartbeat stays the guarantee.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Final

import redis

from orchestrator.leases.keys import ENDED_CHANNEL_PREFIX
from orchestrator.services.lease_keeper import heartbeat

__all__ = ["GenerationWatch", "watch_for"]

log = logging.getLogger(__name__)

#: How long the listener waits for a message before it looks at what to (un)subscribe.
POLL_SECONDS: Final = 0.2


class GenerationWatch:
    """One listener thread per process; `follow` and `unfollow` a task around its round."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._wanted: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: Set while the subscriptions match what is followed (for tests and start-up).
        self.in_step = threading.Event()
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop listening (the thread ends within a poll)."""
        self._closed.set()

    def follow(self, task_id: str) -> None:
        with self._lock:
            self._wanted[task_id] += 1
            self.in_step.clear()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="generation-watch", daemon=True
                )
                self._thread.start()

    def unfollow(self, task_id: str) -> None:
        with self._lock:
            self._wanted[task_id] -= 1
            if self._wanted[task_id] <= 0:
                del self._wanted[task_id]

    def _run(self) -> None:
        backoff = POLL_SECONDS
        while not self._closed.is_set():
            client = redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=5)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                self._listen(pubsub)
            except redis.RedisError as exc:
                log.warning("generation watch: %s; listening again in %.1fs", exc, backoff)
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                # Whatever was published meanwhile is lost: look at every followed lease now.
                with self._lock:
                    followed = list(self._wanted)
                for task_id in followed:
                    heartbeat().check_now(task_id)
            finally:
                pubsub.close()
                client.close()

    def _listen(self, pubsub: redis.client.PubSub) -> None:
        subscribed: set[str] = set()
        while not self._closed.is_set():
            with self._lock:
                wanted = set(self._wanted)
            if wanted - subscribed:
                pubsub.subscribe(*[ENDED_CHANNEL_PREFIX + t for t in wanted - subscribed])
            if subscribed - wanted:
                dropped = [ENDED_CHANNEL_PREFIX + t for t in subscribed - wanted]
                pubsub.unsubscribe(*dropped)  # type: ignore[no-untyped-call]
            subscribed = wanted
            with self._lock:
                if set(self._wanted) == subscribed:
                    self.in_step.set()
            message = pubsub.get_message(timeout=POLL_SECONDS)
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"]
            if isinstance(channel, bytes):
                channel = channel.decode("utf-8", "replace")
            heartbeat().check_now(str(channel).removeprefix(ENDED_CHANNEL_PREFIX))


_watch: tuple[int, GenerationWatch] | None = None
_watch_lock = threading.Lock()


def watch_for(url: str | None) -> GenerationWatch | None:
    """This process's watch on the Redis at `url` (None without Redis); a new one after a fork."""
    if not url:
        return None
    global _watch
    with _watch_lock:
        if _watch is None or _watch[0] != os.getpid() or _watch[1].url != url:
            if _watch is not None and _watch[0] == os.getpid():
                _watch[1].close()  # another Redis (tests): the old listener ends
            _watch = (os.getpid(), GenerationWatch(url))
        return _watch[1]
