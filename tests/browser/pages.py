"""What the console's browser tests share: opening a task's page, a transcript entry as the
API sends it, a task's deliveries dead-lettered."""

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


def dead_letter_deliveries(console: Console, task_id: str) -> list[int]:
    """The task's webhooks as the dispatcher leaves them after a backend failed every attempt
    (two of them throttled); their ids."""
    from sqlalchemy import select, update

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            ids = list(conn.execute(select(outbox.c.outbox_id).where(outbox.c.task_id == task_id)))
            conn.execute(
                update(outbox)
                .where(outbox.c.task_id == task_id)
                .values(status="dead", attempts=8, throttled=2, last_error="HTTP 503")
            )
    finally:
        db.dispose()
    return [int(row[0]) for row in ids]
