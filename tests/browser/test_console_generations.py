"""Why each generation of a task ran, on its page: the requeue, decision or recovery that
queued it (who and why), in a real headless chromium against a real API, worker and sweeper
with the scripted model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATORS, Console, shot
from tests.browser.pages import open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_finished_task_requeued_says_who_requeued_it_and_why(
    browser: Any, console: Console
) -> None:
    """An operator requeues a completed task from its page. Before, the generations table
    showed generation 1 `completed` and a generation 2 with no word of the requeue: the
    requeue's who and why (kept in the task's events) were on no page."""
    task_id = console.trigger("xss", "Requeued after the meter was fixed")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{console.url}/console?token={OPERATORS['otto'][1]}")
        expect(page.locator("#whoami-name")).to_have_text("otto")
        open_task(page, console, task_id)
        page.fill("#requeue-reason", "meter data corrected")
        page.click("#requeue-form button[type=submit]")
        expect(page.locator("#op-result")).to_have_text("Requeue: done.")
        row = page.locator("#generations tbody tr").filter(
            has=page.locator('td[data-label="Generation"]', has_text=re.compile(r"^2$"))
        )
        expect(row.locator('td[data-label="Queued because"]')).to_have_text(
            "requeued by otto: meter data corrected"
        )
        first = page.locator("#generations tbody tr").filter(
            has=page.locator('td[data-label="Generation"]', has_text=re.compile(r"^1$"))
        )
        expect(first.locator('td[data-label="Queued because"]')).to_have_text("triggered")
        shot(page, "requeued-generations")
    finally:
        context.close()
    assert not errors, errors
    view = console.task(task_id)
    [again] = [x for x in view["executions"] if x["generation"] == 2]
    assert again["queued_because"] == "requeued by otto: meter data corrected"


def test_a_cancelled_task_s_plan_says_its_open_nodes_will_not_run(
    page: Any, console: Console
) -> None:
    """A task cancelled while a node runs: its plan stays as its last revision left it. Before,
    the page drew that node `running` (and the counts "running 1") under a cancelled status,
    with no word that nothing of it runs any more."""
    task_id = console.trigger("slow", "Cancelled mid-step")
    console.wait_for(task_id, lambda t: bool(t["plan"]))
    open_task(page, console, task_id)
    expect(page.locator("#plan-title")).to_have_text("Slow")
    expect(page.locator("#plan-stopped")).to_have_count(0)  # running: its nodes may still move
    cancelled = console.http.post(
        f"/api/v1/tasks/{task_id}/cancel", json={"reason": "duplicate complaint"}
    )
    assert cancelled.status_code == 200, cancelled.text
    expect(page.locator("#plan-stopped")).to_have_text(
        "The task is cancelled: nothing more of this plan runs. 1 node (running 1) stays as "
        "the last revision left it."
    )
    shot(page, "cancelled-plan")


def test_a_requeue_with_the_api_token_records_the_name_given(page: Any, console: Console) -> None:
    """Signed in with the shared API token, approvals ask the person's name; Requeue and Cancel
    did not, and the task's generations said "requeued by an operator": who it was was lost."""
    task_id = console.trigger("xss", "Requeued by a named person")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    page.fill("#requeue-by", "dana")
    page.fill("#requeue-reason", "the meter was recalibrated")
    page.click("#requeue-form button[type=submit]")
    expect(page.locator("#op-result")).to_have_text("Requeue: done.")
    row = page.locator("#generations tbody tr").filter(
        has=page.locator('td[data-label="Generation"]', has_text=re.compile(r"^2$"))
    )
    expect(row.locator('td[data-label="Queued because"]')).to_have_text(
        "requeued by dana: the meter was recalibrated"
    )
    # The name is kept for the next time, as an approval's is.
    page.reload()
    expect(page.locator("#requeue-by")).to_have_value("dana")
