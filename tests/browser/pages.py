"""What the console's browser tests share: opening a task's page, a transcript entry as the
API sends it."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.browser.conftest import Console


def open_task(page: Any, console: Console, task_id: str) -> None:
    page.goto(f"{console.url}/console#/task/{task_id}")
    expect(page.locator("#task-title")).to_be_visible()


def transcript_entry(seq: int, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A transcript entry in the API's shape (TranscriptEntryView)."""
    return {"seq": seq, "generation": 1, "turn": seq, "kind": kind, "call_id": None,
            "parent_call_id": None, "tool_name": None, "status": None, "usage": None,
            "body": body}  # fmt: skip
