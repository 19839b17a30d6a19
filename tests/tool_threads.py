"""Waiting for the threads the tool host leaves behind (a call given up or left after a cancel),
instead of sleeping: what a late return records is checked once it has surely returned."""

from __future__ import annotations

import threading
import time

__all__ = ["join_tool_threads"]


def join_tool_threads(tool_name: str, timeout: float = 10.0) -> None:
    """Wait until no host thread runs a call of `tool_name` (`ToolHost._start` names a thread
    `tool-<name>` until the call has returned and recorded what it did; the thread itself
    stays for the next call); fail if one still does after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while any(thread.name == f"tool-{tool_name}" for thread in threading.enumerate()):
        assert time.monotonic() < deadline, f"a {tool_name} call did not end within {timeout} s"
        time.sleep(0.01)
