"""`GET /readyz`: can this API process serve requests now?

`/healthz` is liveness only (the process answers; a supervisor restarts it when it does not).
Readiness asks the parts every request needs: the store answers `SELECT 1` and, when configured,
Redis answers `PING`, each within `READY_TIMEOUT_SECONDS`, both at once. A load balancer takes
a process that is not ready out of rotation instead of sending it requests that would fail.

Each check runs in a daemon thread of its own, at most `MAX_IN_FLIGHT` at once: a store that
hangs holds a few threads until its connect timeout, never the API's pool, never the process's
exit, and later probes answer `not ready` in time.
What a failure says is fixed text and the exception's class, never its message (a URL, a
password); the first line of the cause goes to the log, masked, when readiness is lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import text

from orchestrator.store.db import Database

if TYPE_CHECKING:
    import redis

__all__ = ["READY_TIMEOUT_SECONDS", "Check", "Readiness"]

log = logging.getLogger(__name__)

#: How long each part may take to answer before the process is reported not ready.
READY_TIMEOUT_SECONDS = 2.0

#: Checks running at once in this process (a hanging part keeps its threads until it times out).
MAX_IN_FLIGHT = 8
_IN_FLIGHT = threading.BoundedSemaphore(MAX_IN_FLIGHT)


class _Busy(Exception):
    """Earlier checks still wait on a part that hangs."""


async def _in_a_thread(probe: Callable[[], None]) -> None:
    """Run `probe` in a daemon thread and wait for it (cancelling the wait leaves it running)."""
    if not _IN_FLIGHT.acquire(blocking=False):
        raise _Busy()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return  # the wait timed out meanwhile
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            probe()
        except BaseException as exc:  # handed to the waiting coroutine
            error = exc
        finally:
            _IN_FLIGHT.release()
        with suppress(RuntimeError):  # the loop closed while a hanging check waited
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="readyz", daemon=True).start()
    await done


@dataclass(frozen=True)
class Check:
    """One part's answer: `code` is None when it is ready. `cause` is for the log only."""

    part: str
    code: str | None = None
    message: str = "ok"
    cause: str = ""


class Readiness:
    """The checks of one API process (its store, its Redis)."""

    def __init__(
        self,
        db: Database,
        redis_url: str | None,
        *,
        timeout: float = READY_TIMEOUT_SECONDS,
    ) -> None:
        self.db = db
        self.timeout = timeout
        self.redis: redis.Redis | None = None
        if redis_url:
            import redis  # here: an embedded API (no Redis) never imports redis-py (0.1 s)

            self.redis = redis.Redis.from_url(
                redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        self._ready = True

    async def check(self) -> list[Check]:
        """Every part's answer, in order (store, then Redis when configured)."""
        probes = [self._run("store", "store_unavailable", "the store", self._query_store)]
        if self.redis is not None:
            probes.append(self._run("redis", "redis_unavailable", "Redis", self._ping_redis))
        checks = list(await asyncio.gather(*probes))
        failed = [check for check in checks if check.code is not None]
        if failed and self._ready:  # one line when readiness is lost, not one per probe
            log.warning("not ready: %s", "; ".join(f"{c.message}: {c.cause}" for c in failed))
        elif not failed and not self._ready:
            log.info("ready again: every part answers")
        self._ready = not failed
        return checks

    async def _run(self, part: str, code: str, name: str, probe: Callable[[], None]) -> Check:
        try:
            await asyncio.wait_for(_in_a_thread(probe), self.timeout)
        except (TimeoutError, _Busy):
            message = f"{name} did not answer within {self.timeout:g}s"
            return Check(part, code, message, "timed out")
        except Exception as exc:
            cause = getattr(exc, "orig", None) or exc
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            return Check(part, code, f"{name} is unavailable ({type(cause).__name__})", first)
        return Check(part)

    def _query_store(self) -> None:
        with self.db.transaction(readonly=True) as conn:
            conn.execute(text("SELECT 1"))

    def _ping_redis(self) -> None:
        assert self.redis is not None
        self.redis.ping()

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
