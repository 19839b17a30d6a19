"""Waiting for the threads the tool host leaves behind (a call given up or left after a cancel),
instead of sleeping: what a late return records is checked once it has surely returned."""

from __future__ import annotations

import threading

__all__ = ["join_tool_threads"]


def join_tool_threads(tool_name: str, timeout: float = 10.0) -> None:
    """Wait until every host thread running `tool_name` has ended (`ToolHost._start` names
    them `tool-<name>`); fail if one is still running after `timeout` seconds."""
    for thread in threading.enumerate():
        if thread.name == f"tool-{tool_name}":
            thread.join(timeout)
            assert not thread.is_alive(), f"a {tool_name} call did not end within {timeout} s"
