"""The console's lists of deliveries to the business backend, in a real headless chromium
against a real API, worker and sweeper: every failing delivery retried at once after a
confirmation, what a discarded or retried row says of who and how, and a task's page that
shows some of its undelivered rows saying so and leading to them all.

Tests run in file order on one fleet: the first counts every failing delivery of the store.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATORS, Console, shot
from tests.browser.pages import (
    dead_letter_deliveries,
    delivery_row,
    failing_alone,
    more_events,
    open_task,
    set_rows,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_every_failing_delivery_is_retried_at_once_after_a_confirmation(
    page: Any, console: Console, browser: Any
) -> None:
    """The API makes every failing pending delivery due now (`POST /api/v1/outbox/retry-failing`,
    `outbox retry --all-failing`) once the backend is mended after an outage; the deliveries
    view offered Retry row by row only. One button does it, after a confirmation, and says how
    many were retried and how many a dispatcher was sending (left to it). A viewer is not
    offered it."""
    from orchestrator.store.types import utcnow

    retried, sending = (console.trigger("xss", f"Failing {n}") for n in ("alone", "and held"))
    for task_id in (retried, sending):
        console.wait_for(task_id, lambda t: t["status"] == "completed")
    first = failing_alone(console, retried)
    held = failing_alone(console, sending)
    set_rows(console, {held: {"claimed_until": utcnow() + timedelta(minutes=10)}})
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(delivery_row(page, "#delivery-rows", first).locator("button[data-retry]")).to_have_count(
        1
    )
    button = page.locator("#retry-every-failing")
    expect(button).to_have_text("Retry every failing task event delivery")
    button.click()
    confirm = page.locator("#retry-failing-confirm")
    expect(confirm).to_contain_text(
        "Send every task event delivery that failed and backs off now, its counts kept?"
    )
    confirm.get_by_role("button", name="Cancel").click()
    expect(confirm).to_have_count(0)
    listed = console.http.get(f"/api/v1/outbox/{first}").json()
    assert listed["retried_at"] is None  # nothing was sent
    button.click()
    shot(page, "deliveries-retry-failing-confirm")
    confirm.get_by_role("button", name="Retry them").click()
    expect(page.locator("#delivery-result")).to_have_text(
        "1 failing task event delivery is due now. 1 being sent now is left to its dispatcher: "
        "retry it once its answer is in, if it failed."
    )
    expect(confirm).to_have_count(0)
    assert console.http.get(f"/api/v1/outbox/{first}").json()["retried_at"] is not None
    assert console.http.get(f"/api/v1/outbox/{held}").json()["retried_at"] is None
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        viewer = context.new_page()
        viewer.goto(f"{console.url}/console?token={OPERATORS['vera'][1]}")
        expect(viewer.locator("#whoami-role")).to_have_text("viewer")
        viewer.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
        expect(viewer.locator("#delivery-rows tbody tr").first).to_be_visible()
        expect(viewer.locator("#retry-every-failing")).to_have_count(0)
    finally:
        context.close()


def test_a_row_discarded_while_pending_and_one_retried_by_no_name_say_so_plainly(
    page: Any, console: Console
) -> None:
    """The deliveries list's Status read a bare `discarded` for a row discarded while pending
    (`discarded_from: pending`: never dead-lettered), and a retry recorded without a name
    (`retried_by` null, `retried_at` set) was not shown at all."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "Discarded while pending, retried by no name")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    more_events(console, task_id, 1)
    discarded, retried, *_ = dead_letter_deliveries(console, task_id)
    now = utcnow()
    set_rows(console, {
        discarded: {"status": "discarded", "discarded_from": "pending", "discarded_at": now,
                    "discarded_by": "kim", "discard_reason": "settled by phone"},
        retried: {"retried_at": now, "retried_by": None},
    })  # fmt: skip
    page.goto(f"{console.url}/console#/deliveries?status=discarded&kind=webhook")
    row = delivery_row(page, "#delivery-rows", discarded)
    expect(row.locator("td").nth(3)).to_have_text("discarded while pending")
    page.goto(f"{console.url}/console#/deliveries?status=dead&kind=webhook")
    row = delivery_row(page, "#delivery-rows", retried)
    expect(row.locator(".retried")).to_contain_text("retried by an unrecorded name ")
    shot(page, "deliveries-retried-by-no-name")


def test_a_task_page_showing_some_undelivered_rows_says_so_and_links_to_them_all(
    page: Any, console: Console
) -> None:
    """A task's page lists the first 20 of its undelivered rows (dead ones first), as `tasks
    show` does; it cut there without a word, where `tasks show` says `... 20 of the N not
    delivered shown`. It says so, and links to the deliveries view of that task's dead and
    pending rows, which lists them all."""
    task_id = console.trigger("xss", "Twenty-six events not delivered")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    more_events(console, task_id, 25)
    dead = dead_letter_deliveries(console, task_id)  # all 26, dead
    fresh = {"status": "pending", "attempts": 0, "throttled": 0, "last_error": None}
    set_rows(console, dict.fromkeys(dead[2:], fresh))
    open_task(page, console, task_id)
    expect(page.locator("#deliveries tbody tr")).to_have_count(20)
    said = page.locator("#deliveries-more")
    expect(said).to_have_text(
        "20 of the 26 not delivered are shown, dead ones first: all 2 dead, all 24 pending."
    )
    shot(page, "task-deliveries-more")
    said.get_by_role("link", name="all 24 pending").click()
    expect(page.locator("h1")).to_have_text("Deliveries to the business backend")
    expect(page.locator("#delivery-task")).to_contain_text(f"Of task {task_id} only.")
    rows = page.locator("#delivery-rows tbody tr")
    expect(rows).to_have_count(24)
    expect(rows.filter(has_text=task_id)).to_have_count(24)
    expect(page.locator("#d-status")).to_have_value("pending")
    # Another status of the same task, from the filters: the task is kept.
    page.select_option("#d-status", "dead")
    page.click("#delivery-filters button")
    expect(rows).to_have_count(2)
    expect(page.locator("#delivery-task")).to_contain_text(f"Of task {task_id} only.")
    page.locator("#delivery-task").get_by_role("link", name="All tasks").click()
    expect(page.locator("#delivery-task")).to_have_count(0)
    assert re.search(r"#/deliveries\?status=dead$", page.url)
