"""The long-running commands' stop request: a SIGTERM always ends the wait, whatever the main
thread held when Python ran the handler. Each case runs in a child process of its own, as a
handler that hangs would hang the test process with it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _child(body: str) -> subprocess.Popen[str]:
    code = "import os, signal, time\nfrom orchestrator.cli.stopping import StopSignals\n" + body
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


#: How long a child may take before it counts as hung: it imports the CLI's package (about 2 s
#: on an idle machine, over 10 s on two cores loaded six deep); a hang is for ever.
HUNG_AFTER = 60


def _finish(child: subprocess.Popen[str], seconds: float = HUNG_AFTER) -> str:
    try:
        out, _ = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        raise AssertionError(f"the child hung: {out}") from None
    assert child.returncode == 0, out
    return out


def test_a_signal_that_lands_while_the_main_thread_holds_the_events_lock_does_not_hang() -> None:
    # What hung the sweeper in CI: the handler ran inside the main thread's own Event.wait(),
    # which held the event's lock, and a handler calling Event.set() waited on it for ever.
    # Here the lock is held on purpose when the signal arrives.
    child = _child(
        "signals = StopSignals()\n"
        "with signals.event._cond:\n"  # the lock Event.wait() holds around its checks
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    for _ in range(10000):\n"  # bytecodes: the handler runs in here
        "        pass\n"
        "print('stop asked:', signals.wait(0))\n"
        "print('event set:', signals.event.is_set())\n"
    )
    out = _finish(child)
    assert "stop asked: True" in out, out
    assert "event set: True" in out, out


def test_a_wait_ends_when_the_signal_comes_and_not_before() -> None:
    child = _child(
        "signals = StopSignals()\n"
        "started = time.monotonic()\n"
        "print('quiet:', signals.wait(0.2), signals.event.is_set(), flush=True)\n"
        "print('ready', flush=True)\n"
        "asked = signals.wait(30)\n"
        "print('asked:', asked, 'after', round(time.monotonic() - started, 1), flush=True)\n"
        "signals.close()\n"
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "quiet: False False"
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    out = _finish(child)
    asked, seconds = out.split("after")
    assert asked.strip() == "asked: True", out
    assert float(seconds) < 5, out  # woken by the signal, not by the 30 s timeout


def test_a_signal_before_the_wait_ends_it_at_once() -> None:
    child = _child(
        "signals = StopSignals()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "started = time.monotonic()\n"
        "print(signals.wait(30), time.monotonic() - started < 5)\n"
    )
    assert _finish(child).strip() == "True True"


def test_another_signal_does_not_end_the_wait() -> None:
    # SIGUSR1 with a Python handler also reaches the wakeup socket: it is not a stop.
    child = _child(
        "signal.signal(signal.SIGUSR1, lambda *_: None)\n"
        "signals = StopSignals()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print(signals.wait(0.3), signals.wait(0))\n"
    )
    assert _finish(child).strip() == "False False"


def test_the_process_is_not_left_with_a_wakeup_fd_after_close() -> None:
    child = _child(
        "before = signal.set_wakeup_fd(-1)\n"
        "signal.set_wakeup_fd(before)\n"
        "signals = StopSignals()\n"
        "signals.close()\n"
        "print(signal.set_wakeup_fd(-1) == before)\n"
    )
    assert _finish(child).strip() == "True"
