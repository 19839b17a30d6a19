"""Leaving a view while its poll is in flight, in a real headless chromium against a real API,
worker and sweeper: an answer that comes after the operator left a page draws nothing, and
above all does not put the page it belongs to back in the address.

A hash-only navigation changes the address at once and tells the page (`hashchange`) a task
later; an answer of the page left that lands in between was drawn, and the task page wrote its
own address back (`history.replaceState`, which keeps a revision and node in it), so the view
the operator asked for never showed. The answer is held in the page (`hold_answer`) and let go
in the same task as the navigation, so that it lands in that gap every time: with `page.route`
it lands there only sometimes.

A test that holds a poll's answer (the list's, every 6 s) stops the page's clock and runs the
poll itself (`pages.pause_clock`): it waited for the poll's own timer, within 10 s, 6 of them
the timer's, and at load 7 the poll's answer came later than the 4 s left (the two tests failed
once in a 5-file run). The task page's first read is held with the clock stopped too: the 3-s
poll read the task again meanwhile, and its answer, not held, drew the forms the test looks for
before that answer.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from tests.browser.pages import dead_letter_deliveries, hold_answer, pause_clock, set_rows

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_answer_of_a_task_page_left_does_not_bring_it_back(page: Any, console: Console) -> None:
    task_id = console.trigger("approval", "Left while its view was on its way")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    hold_answer(page, f"/api/v1/tasks/{task_id}")
    page.goto(f"{console.url}/console#/task/{task_id}")
    page.wait_for_function("() => window.__release !== undefined")  # the view's answer, held
    page.evaluate("() => { location.hash = '#/deliveries?status=dead'; window.__release(); }")
    expect(page.locator("#delivery-filters")).to_be_visible()
    expect(page.locator("#task-title")).to_have_count(0)
    assert page.url.endswith("#/deliveries?status=dead")
    # The page left polls no more: its timers and stream went with it.
    with page.expect_request(lambda r: "/api/v1/outbox?" in r.url):
        pass  # the deliveries view's next poll, 6 s on
    assert page.evaluate("() => document.querySelectorAll('#task-head').length") == 0


def test_a_poll_answered_after_a_newer_page_of_the_list_does_not_replace_it(
    page: Any, console: Console
) -> None:
    """The task list's poll of page 1 is slow; meanwhile the operator goes to page 2 (Older),
    which is answered first. The late answer of page 1 is not drawn over page 2 (before, page
    1's rows stood under "page 2" until the next poll, 6 s on)."""
    older = console.trigger("xss", "The older of two")
    newer = console.trigger("xss", "The newer of two")
    hold_answer(page, "/api/v1/tasks?limit=1", nth=2)  # the first poll after the page opens
    pause_clock(page)
    page.goto(f"{console.url}/console#/?limit=1")
    expect(page.locator(f'#task-rows a[href="#/task/{newer}"]')).to_have_count(1)
    page.clock.fast_forward(6_000)  # that poll
    page.wait_for_function("() => window.__release !== undefined", polling=100)
    page.clock.resume()
    page.click("#next-page")
    expect(page.locator(f'#task-rows a[href="#/task/{older}"]')).to_have_count(1)
    expect(page.locator("#page-number")).to_have_text("page 2")
    # Let go, and a task later (its answer resolves in microtasks) drawn, if it is drawn at all.
    page.evaluate("async () => { window.__release(); await new Promise((r) => setTimeout(r)); }")
    assert page.locator(f'#task-rows a[href="#/task/{older}"]').count() == 1
    assert page.locator("#page-number").inner_text() == "page 2"


def test_a_task_s_older_answer_coming_last_does_not_replace_the_newer(
    page: Any, console: Console
) -> None:
    """The task page's first read is slow; the task is requeued meanwhile, and the next poll
    draws a later generation. The first read, answered last, is not drawn over it (before, the
    page went back to generation 1 until the poll after)."""
    task_id = console.trigger("xss", "Read twice on a slow API")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    hold_answer(page, f"/api/v1/tasks/{task_id}")
    page.goto(f"{console.url}/console#/task/{task_id}")
    page.wait_for_function("() => window.__release !== undefined")  # generation 1, held
    requeued = console.http.post(
        f"/api/v1/tasks/{task_id}/requeue", json={"reason": "look again", "by": "ana"}
    )
    assert requeued.status_code == 200, requeued.text
    generation = page.locator("#task-head dt:text-is('Generation') + dd")
    later = re.compile(r"^([2-9]|\d\d+)$")  # (its script runs on: later ones follow)
    expect(generation).to_have_text(later)  # the next poll's answer
    page.evaluate("async () => { window.__release(); await new Promise((r) => setTimeout(r)); }")
    assert later.match(generation.inner_text())  # as it is now, not after a retry


def test_a_poll_answered_after_a_retry_does_not_show_the_dead_letter_again(
    page: Any, console: Console
) -> None:
    """On the deliveries view, a slow poll is still on its way when the operator retries a dead
    letter; the list read after the retry shows it gone from the dead ones. The poll's answer,
    older, is not drawn over it (before, the row and its Retry came back until the next poll)."""
    task_id = console.trigger("xss", "Retried while the poll was slow")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    dead, *_ = dead_letter_deliveries(console, task_id)
    hold_answer(page, "/api/v1/outbox?status=dead&limit=100", nth=2)  # the first poll's
    pause_clock(page)
    page.goto(f"{console.url}/console#/deliveries?status=dead")
    retry = page.locator(f'#delivery-rows button[data-retry="{dead}"]')
    expect(retry).to_have_count(1)
    # The list changes before the poll, so its answer is the dead letter again, not a 304 (which
    # the page would answer with the list as it holds it then: the retried one gone).
    set_rows(console, {dead: {"last_error": "HTTP 502"}})
    page.clock.fast_forward(6_000)  # that poll
    page.wait_for_function("() => window.__release !== undefined", polling=100)
    page.clock.resume()
    retry.click()
    expect(page.locator("#delivery-result")).to_have_text(f"Delivery {dead} is due again.")
    expect(retry).to_have_count(0)
    page.evaluate("async () => { window.__release(); await new Promise((r) => setTimeout(r)); }")
    assert retry.count() == 0  # as it is now, not after a retry


def test_an_older_answer_of_a_task_s_pending_actions_does_not_bring_one_back(
    page: Any, console: Console
) -> None:
    """The task page's first read of its pending actions is slow; the task is cancelled
    meanwhile (its action superseded), and the read after the poll's changed view draws none.
    The first read, answered last, is not drawn over it (before, the superseded action came
    back with its Approve and Reject, and stayed while the view did not change again)."""
    task_id = console.trigger("approval", "Cancelled while its actions were read")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    hold_answer(page, f"/api/v1/actions?status=pending_approval&limit=200&task_id={task_id}")
    page.goto(f"{console.url}/console#/task/{task_id}")
    page.wait_for_function("() => window.__release !== undefined")  # the action, held
    cancelled = console.http.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "a duplicate"})
    assert cancelled.status_code == 200, cancelled.text
    pending = page.locator("#pending-actions")
    expect(pending).to_have_text("Nothing waits for approval.")  # the next poll's read
    page.evaluate("async () => { window.__release(); await new Promise((r) => setTimeout(r)); }")
    assert pending.locator("[data-action]").count() == 0
    assert pending.inner_text() == "Nothing waits for approval."


def test_a_finished_task_s_page_offers_no_write_before_its_first_answer(
    page: Any, console: Console
) -> None:
    """The task page's first read is slow: until it comes the page does not know the task's
    state, and offers neither Requeue nor Cancel (before, a finished task offered Cancel until
    then, which the API answers 409). Once it comes, a finished task offers Requeue only."""
    task_id = console.trigger("xss", "Finished, on a slow API")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    hold_answer(page, f"/api/v1/tasks/{task_id}")
    pause_clock(page)  # no poll reads the task meanwhile
    page.goto(f"{console.url}/console#/task/{task_id}")
    page.wait_for_function("() => window.__release !== undefined", polling=100)  # the view, held
    expect(page.locator("#h-ops")).to_be_visible()  # the page is drawn, the task not yet
    assert page.locator("#requeue-form").is_hidden()
    assert page.locator("#cancel-form").is_hidden()
    page.evaluate("() => window.__release()")
    expect(page.locator("#requeue-form")).to_be_visible()
    expect(page.locator("#cancel-form")).to_be_hidden()


def test_an_older_answer_of_the_transcript_does_not_take_entries_away(
    page: Any, console: Console
) -> None:
    """The task page's first read of the transcript is slow; the task is requeued meanwhile and
    its next generation writes more entries, which the read after the task's change draws. The
    first read, answered last, is not drawn over it (before, the entries of the new generation
    went away until the next read, up to 15 s on)."""
    task_id = console.trigger("xss", "Its transcript read twice")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    hold_answer(page, f"/api/v1/tasks/{task_id}/transcript?limit=200")
    page.goto(f"{console.url}/console#/task/{task_id}")
    page.wait_for_function("() => window.__release !== undefined")  # generation 1's, held
    first = len(console.http.get(f"/api/v1/tasks/{task_id}/transcript").json()["items"])
    requeued = console.http.post(
        f"/api/v1/tasks/{task_id}/requeue", json={"reason": "look again", "by": "ana"}
    )
    assert requeued.status_code == 200, requeued.text
    entries = page.locator("#transcript ol.transcript > li")
    expect(entries.filter(has_text="generation 2")).not_to_have_count(0)
    drawn = entries.count()
    assert drawn > first
    page.evaluate("async () => { window.__release(); await new Promise((r) => setTimeout(r)); }")
    assert entries.count() >= drawn  # (its script runs on: later entries may follow)
    assert entries.filter(has_text="generation 2").count() > 0
