"""What a task's page tells an operator of how the task ended and who decided its actions, in a
real headless chromium against a real API, worker and sweeper with the scripted model: a task
the agent reported failed says why in the report's words under "Last error", and a task with
more decided actions than a page lists the newest and reads older ones a page at a time.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, shot
from tests.browser.pages import open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: The report's summary of the failing round: longer than the last error holds.
SUMMARY = (
    "The turbidity at DM-RN-01 could not be traced: the SCADA point has reported a flat 0.00 "
    "NTU since the sensor swap on Monday. Ask the metering crew to check the new sensor's "
    "wiring, then requeue. " + "Every reading looked at is listed in the findings. " * 6
)


def write_script(console: Console, task_type: str, turns: list[dict[str, Any]]) -> None:
    """A script of the console's scripted model, beside the module's own (it reads each anew)."""
    folder = Path(console.env["ORCH_MODEL"].split(":", 1)[1])
    (folder / f"{task_type}.json").write_text(json.dumps({"turns": turns}), encoding="utf-8")


def fact(page: Any, box: str, name: str) -> Any:
    """The value of the fact `name` in the facts of `box`."""
    return page.locator(f"{box} dt", has_text=name).locator("xpath=following-sibling::dd[1]")


def test_a_task_the_report_failed_says_why_in_its_last_error(page: Any, console: Console) -> None:
    failed = {
        "id": "trace",
        "title": "Trace the turbidity",
        "actor": "agent",
        "status": "failed",
        "reason": "the SCADA point is flat since the swap",
    }
    plan = {"request_id": "r1", "title": "Trace", "reason": "r1", "nodes": [failed], "edges": []}
    report = {"summary": SUMMARY, "findings": [], "outcome": "failed"}
    write_script(
        console,
        "fails_by_report",
        [
            {"tool_calls": [{"id": "c1", "name": "publish_execution_plan", "arguments": plan}]},
            {"tool_calls": [{"id": "c2", "name": "save_report", "arguments": report}]},
            {"content": "done"},
        ],
    )
    task_id = console.trigger("fails_by_report", "Turbid water that cannot be traced")
    console.wait_for(task_id, lambda t: t["status"] == "failed")
    open_task(page, console, task_id)
    expect(page.locator("#task-head .badge").first).to_have_text("failed")
    # Why, as the report says it and marked as the report's: before, "the report declared the
    # task failed" alone, the reason further down the page.
    last_error = fact(page, "#task-head", "Last error")
    expect(last_error).to_contain_text(
        "the report declared the task failed: The turbidity at DM-RN-01 could not be traced"
    )
    expect(last_error).to_contain_text("…")  # shortened: the report holds the whole summary
    expect(page.locator("#report-summary")).to_contain_text(SUMMARY.split(". ")[-2])
    shot(page, "task-failed-by-report")


def decided_actions(console: Console, task_id: str, count: int) -> list[str]:
    """`count` decided actions of the task written into the store, a second apart (approved,
    rejected or superseded in turn): their ids, newest first."""
    from sqlalchemy import insert

    from orchestrator.store import Database
    from orchestrator.store.tables import actions
    from orchestrator.store.types import utcnow

    session_id = console.task(task_id)["session_id"]
    now = utcnow()
    statuses = ("approved", "rejected", "superseded")
    rows = [
        {
            "action_id": f"old-{i:03d}-{task_id[:8]}",
            "task_id": task_id,
            "generation": 1,
            "session_id": session_id,
            "node_id": "a",
            "kind": "work_order",
            "payload": {"what": f"work order {i}"},
            "status": statuses[i % 3],
            "decided_by": f"approver {i}",
            "decided_at": now - timedelta(seconds=count - i),
            "note": f"decided as number {i}",
            "created_at": now - timedelta(seconds=count - i),
            "plan_revision": 1,
            "digest": f"{i:064x}",
        }
        for i in range(count)
    ]
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            conn.execute(insert(actions), rows)
    finally:
        db.dispose()
    return [str(row["action_id"]) for row in reversed(rows)]


def test_older_decided_actions_are_read_a_page_at_a_time(page: Any, console: Console) -> None:
    task_id = console.trigger("xss", "A main with a long history of work orders")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    newest_first = decided_actions(console, task_id, 45)
    open_task(page, console, task_id)
    cards = page.locator("#decided-actions article.action")
    # The 20 newest, and a way to the older ones: before, every one of them up to 200, and
    # past 200 a note that the page could show no more.
    expect(cards).to_have_count(20)
    expect(cards.first).to_have_attribute("data-action", newest_first[0])
    expect(cards.last).to_have_attribute("data-action", newest_first[19])
    expect(page.locator("#decided-shown")).to_have_text(
        "The 20 newest decided actions are shown; older ones follow."
    )
    more = page.locator("#decided-more")
    expect(more).to_have_text("Show 20 more")
    more.click()
    expect(cards).to_have_count(40)
    expect(page.locator("#decided-shown")).to_contain_text("The 40 newest")
    more.click()
    expect(cards).to_have_count(45)
    expect(more).to_be_hidden()
    expect(page.locator("#decided-shown")).to_be_hidden()
    oldest = cards.last
    expect(oldest).to_have_attribute("data-action", newest_first[-1])
    expect(oldest).to_contain_text("approver 0")
    expect(oldest).to_contain_text("decided as number 0")
    assert [c.get_attribute("data-action") for c in cards.all()] == newest_first
    shot(page, "task-decided-actions-paged")
