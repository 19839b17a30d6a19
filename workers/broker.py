"""Kombu's Redis transport, mended so a worker survives a Redis restart under it.

When the broker connection drops, Celery's consumer first collects the connection (which
detaches the transport from its `Connection`: `transport.client = None`) and then closes it.
Closing the default channel restores the channel's unacknowledged messages, which opens a
client, which reads the connection parameters from `transport.client`: an `AttributeError`
(`'NoneType' object has no attribute 'hostname'`), not one of the connection errors Celery
ignores while closing, so the worker stops with "Unrecoverable error" instead of reconnecting.
The same happens to a late acknowledgement flushed while the event loop closes.
Kombu 5.7.0 (still so in the newest release we can reach); upstream: celery/kombu#582 and #970
show the same failing path on older versions. The report to file, with a reproduction, the exact
line (`kombu/transport/redis.py:1959`, `Channel._connparams`) and a suggested fix:
docs/upstream/kombu-redis-restart.md. Drop this module once a fixed Kombu is pinned.

Here a channel whose connection was detached answers with a Redis `ConnectionError`: the
error Kombu expects from a broker that went away. Celery ignores it, reconnects, and consumes
again. The messages that channel could not restore are still in Redis's unacked index (Kombu
restores them after the visibility timeout) or were lost with the server's data; either way
the sweeper republishes a queued task whose wake-up is missing, and a wake-up delivered twice
starts at most one agent.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["TRANSPORT", "Channel", "Transport"]

#: The value of Celery's `broker_transport` setting that selects this transport.
TRANSPORT = "workers.broker:Transport"


class Channel(kombu_redis.Channel):
    """A Redis channel that reports a detached connection as a lost broker connection."""

    def _connparams(self, asynchronous: bool = False) -> Any:
        if getattr(self.connection, "client", None) is None:
            raise RedisConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    """Kombu's Redis transport with the channel above."""

    Channel = Channel
