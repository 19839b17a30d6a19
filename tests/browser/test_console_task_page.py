"""What a task's page tells an operator of how the task ended and who decided its actions, in a
real headless chromium against a real API, worker and sweeper with the scripted model: a task
the agent reported failed says why in the report's words under "Last error", and a task with
more decided actions than a page lists the newest and reads older ones a page at a time.
"""

from __future__ import annotations

import json
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
