"""Where a model call runs: the shared clients, and the threads a round waits on.

A model call runs on a thread of its own so that the round waiting for it can stop at once (a
cancel, a lease in doubt) instead of at the call's timeout; and a process's rounds share one
`openai.OpenAI` client (one connection pool) per server and key. `openai_model` is the only
user; it is apart so that the conversation's rules read without the plumbing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal

import openai

from orchestrator.agent.call_threads import CallThreads
from orchestrator.agent.model_http import bounded_http_client

__all__ = ["STOP_POLL_SECONDS", "Waited", "client_for", "close_clients", "submit", "wait"]

#: How often a waiting round looks at its stop event (a cancel, a lease in doubt).
STOP_POLL_SECONDS = 0.1
#: Model calls run on these daemon threads so a round waiting for one can stop at once; a
#: process's rounds share them, and a call never waits for a thread (every round waits on one
#: call at a time; an abandoned call ends within its timeout). Daemons: a call a stopped round
#: left behind (a cold shutdown) does not hold up the worker's exit until the model answers or
#: LLM_TIMEOUT_SECONDS.
_CALLS = CallThreads("model-call")


def submit(create: Callable[..., Any], *args: Any) -> Future[Any]:
    """`create(*args)` started on a model-call thread, its outcome in the future returned."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return  # cancelled before it started
        try:
            future.set_result(create(*args))
        except BaseException as exc:  # the caller reads it from the future
            future.set_exception(exc)

    _CALLS.run(run)
    return future


#: How a wait for a call ended: the call is done, the round was stopped, or the timeout passed.
Waited = Literal["done", "stopped", "late"]


_CLIENTS: dict[tuple[str, str, float], openai.OpenAI] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    """One client (and one connection pool) per server and key, shared by a process's rounds.

    Kept until `close_clients`: a client dropped while a round still used it would close that
    round's connection, and one dropped unclosed leaves its sockets to the garbage collector."""
    key = (base_url, api_key, timeout)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = openai.OpenAI(
                base_url=base_url,
                api_key=api_key,
                timeout=timeout,
                max_retries=0,
                http_client=bounded_http_client(),
            )
            _CLIENTS[key] = client
        return client


def close_clients() -> None:
    """Close every shared client and forget it (a test between servers, a process stopping)."""
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for client in clients:
        client.close()


def wait(call: Future[Any], stop: threading.Event, deadline: float) -> Waited:
    """Wait for `call` until `deadline` (monotonic); sooner if `stop` is set first."""
    done = threading.Event()
    call.add_done_callback(lambda _: done.set())
    while not done.wait(max(0.0, min(STOP_POLL_SECONDS, deadline - time.monotonic()))):
        if stop.is_set():
            return "stopped"
        if time.monotonic() >= deadline:
            return "late"
    return "done"
