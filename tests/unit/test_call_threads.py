"""`agent.call_threads`: every call starts at once on a daemon thread; a thread that finished a
call takes the next, and ends after waiting idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.agent.call_threads import CallThreads


def _wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.005)


def test_calls_run_on_daemon_threads_and_a_finished_thread_takes_the_next() -> None:
    threads = CallThreads("t-reuse", idle_seconds=5)
    seen: list[threading.Thread] = []
    done = threading.Event()

    def record() -> None:
        seen.append(threading.current_thread())
        done.set()

    for _ in range(5):
        done.clear()
        threads.run(record)
        assert done.wait(5)
        _wait_until(lambda: threads.idle() == 1)
    assert len(set(seen)) == 1  # one thread served them all, one after another
    assert seen[0].daemon
    assert seen[0] is not threading.current_thread()


def test_a_call_never_waits_for_a_busy_thread() -> None:
    threads = CallThreads("t-busy", idle_seconds=5)
    release = threading.Event()
    started: list[str] = []

    def hang() -> None:
        started.append("hang")
        release.wait(10)

    ran = threading.Event()
    threads.run(hang)
    _wait_until(lambda: started == ["hang"])
    threads.run(ran.set)  # the only thread is busy: a new one starts
    assert ran.wait(5)
    release.set()


def test_idle_threads_end_after_waiting_and_many_calls_all_run() -> None:
    threads = CallThreads("t-idle", idle_seconds=0.05)
    count = 200
    finished = threading.Semaphore(0)
    gate = threading.Event()

    def call() -> None:
        gate.wait(5)
        finished.release()

    for _ in range(count):
        threads.run(call)
    gate.set()
    for _ in range(count):
        assert finished.acquire(timeout=10)
    _wait_until(lambda: not [t for t in threading.enumerate() if t.name == "t-idle"])
    assert threads.idle() == 0
    # Calls that arrive while threads are timing out still all run.
    for _ in range(50):
        threads.run(finished.release)
        time.sleep(0.002)
    for _ in range(50):
        assert finished.acquire(timeout=10)
