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
again. A round that was running through the restart ends later and acknowledges its wake-up on
that detached channel: there is nothing to acknowledge it on, and Kombu would log a CRITICAL
"Couldn't ack" with a traceback per message (a hundred of them for a busy threads-pool worker,
for a restart the fleet came through). The channel says so in one warning line instead and
forgets the message. The messages that channel could not restore are still in Redis's unacked
index (Kombu restores them after the visibility timeout) or were lost with the server's data;
either way the sweeper republishes a queued task whose wake-up is missing, and a wake-up
delivered twice starts at most one agent.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["TRANSPORT", "Channel", "Transport"]

#: The value of Celery's `broker_transport` setting that selects this transport.
TRANSPORT = "workers.broker:Transport"

log = logging.getLogger(__name__)


class Channel(kombu_redis.Channel):
    """A Redis channel that reports a detached connection as a lost broker connection."""

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self._detached:
            raise RedisConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]

    @property
    def _detached(self) -> bool:
        return getattr(self.connection, "client", None) is None

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if self._detached:
            self._forget(delivery_tag, "acknowledged", "its broker connection was closed")
            return
        try:
            super().basic_ack(delivery_tag, multiple)  # type: ignore[no-untyped-call]
        except self.connection.connection_errors as exc:
            # The same restart seen a moment earlier: the connection is not detached yet.
            self._forget(delivery_tag, "acknowledged", _cause(exc))

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._detached:
            self._forget(delivery_tag, "rejected", "its broker connection was closed")
            return
        try:
            super().basic_reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]
        except self.connection.connection_errors as exc:
            self._forget(delivery_tag, "rejected", _cause(exc))

    def _forget(self, delivery_tag: Any, what: str, why: str) -> None:
        # Only the channel's own record of the message goes: its copy in the broker's unacked
        # index, if the restart kept one, comes back after the visibility timeout, and a
        # wake-up delivered again does nothing (a generation is claimed once).
        kombu_virtual.QoS.ack(self.qos, delivery_tag)  # type: ignore[no-untyped-call]
        log.warning(
            "message %s not %s: %s (Redis restarted or went away); a redelivery of a wake-up "
            "does nothing",
            delivery_tag,
            what,
            why,
        )


def _cause(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class Transport(kombu_redis.Transport):
    """Kombu's Redis transport with the channel above."""

    Channel = Channel
