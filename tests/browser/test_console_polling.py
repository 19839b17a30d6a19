"""What an open task page costs while nothing changes, in a real headless chromium against a
real API, worker and sweeper: its poll every 3 s sends the tag of the view it holds and is
answered `304` with no body (before: the whole view, built from about eighteen statements, at
every poll of every open tab), the page keeps what it shows, and a change is drawn at once.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from tests.browser.pages import open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_unchanged_task_is_not_sent_again_and_a_change_is_drawn(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("retried", "Polled while unchanged")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    view = f"{console.url}/api/v1/tasks/{task_id}"
    tag = console.http.get(view).headers["ETag"]
    answers: list[Any] = []
    page.on("response", lambda r: answers.append(r) if r.url == view else None)
    open_task(page, console, task_id)
    generation = page.locator("#task-head dt:text-is('Generation') + dd")
    expect(generation).to_have_text("1")
    with page.expect_response(lambda r: r.url == view and r.status == 304, timeout=8_000):
        pass  # the next poll
    polled = [r for r in answers if r.status == 304]
    assert polled[0].request.headers["if-none-match"] == tag
    assert polled[0].headers.get("content-length", "0") == "0"  # no body
    # The page shows what it had: the task, its report and evidence.
    expect(page.locator("#task-title")).to_have_text("Polled while unchanged")
    expect(generation).to_have_text("1")
    expect(page.locator("#evidence tr")).not_to_have_count(0)
    # A change is a new answer, drawn (the poll or the stream, whichever comes first).
    requeued = console.http.post(
        f"/api/v1/tasks/{task_id}/requeue", json={"reason": "look again", "by": "ana"}
    )
    assert requeued.status_code == 200, requeued.text
    expect(generation).not_to_have_text("1")  # (its script runs on: later ones follow)


def test_an_unchanged_page_of_the_task_list_is_not_sent_again(page: Any, console: Console) -> None:
    task_id = console.trigger("retried", "Listed while unchanged")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    page.goto(f"{console.url}/console#/")
    link = page.locator(f'#task-rows a[href="#/task/{task_id}"]')
    expect(link).to_have_text("Listed while unchanged")
    listed = f"{console.url}/api/v1/tasks?limit=50"
    with page.expect_response(lambda r: r.url == listed and r.status == 304, timeout=10_000):
        pass  # the next poll, 6 s on
    expect(link).to_have_text("Listed while unchanged")  # the rows shown stay
    expect(page.locator("#list-error")).to_have_count(0)


def test_an_open_task_s_pending_actions_are_not_asked_while_its_view_is_unchanged(
    page: Any, console: Console
) -> None:
    """The task view's tag covers its pending actions: while the view is answered `304`, the
    page does not ask for them (one request per poll, not two); a decision made elsewhere
    changes the view, and the card goes at once."""
    task_id = console.trigger("approval", "Waits for its approval")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    view = f"{console.url}/api/v1/tasks/{task_id}"
    listed = f"{console.url}/api/v1/actions?status=pending_approval&limit=200&task_id={task_id}"
    (action,) = console.http.get(listed).json()["items"]
    open_task(page, console, task_id)
    card = page.locator(f'#pending-actions > article[data-action="{action["action_id"]}"]')
    expect(card).to_have_count(1)
    with page.expect_response(lambda r: r.url == view and r.status == 304, timeout=8_000):
        pass  # a poll of the idle page
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if r.url == listed else None)
    with page.expect_response(lambda r: r.url == view and r.status == 304, timeout=8_000):
        pass  # the next one
    page.wait_for_timeout(500)  # what that poll would ask next, asked by now
    assert asked == []
    expect(card).to_have_count(1)  # the card shown stays
    decided = console.http.post(
        f"/api/v1/actions/{action['action_id']}/reject", json={"by": "ana", "note": "not now"}
    )
    assert decided.status_code == 200, decided.text
    expect(card).to_have_count(0)
    expect(page.locator("#pending-actions")).to_contain_text("Nothing waits for approval.")


def test_the_approvals_page_s_unchanged_reads_are_not_sent_again(
    page: Any, console: Console
) -> None:
    """The approvals page polls the pending count and the oldest pending actions every 6 s,
    each with the tag it holds: `304` for both while nothing is proposed or decided (before,
    both answers whole at every poll), and the cards shown stay."""
    task_id = console.trigger("approval", "Waits on the approvals page")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    counted = f"{console.url}/api/v1/actions/pending-count"
    listed = f"{console.url}/api/v1/actions?status=pending_approval&order=oldest&limit=50"
    tags = {url: console.http.get(url).headers["ETag"] for url in (counted, listed)}
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator("#approvals > article.action").filter(has_text=task_id)
    expect(card).to_have_count(1)
    with (
        page.expect_response(lambda r: r.url == counted and r.status == 304) as count,
        page.expect_response(lambda r: r.url == listed and r.status == 304) as oldest,
    ):
        pass  # the next poll, 6 s on
    assert count.value.request.headers["if-none-match"] == tags[counted]
    assert oldest.value.request.headers["if-none-match"] == tags[listed]
    expect(card).to_have_count(1)
    expect(page.locator("#approvals-count")).not_to_have_text("")


def test_the_deliveries_view_sends_the_tag_its_list_came_with(page: Any, console: Console) -> None:
    """The deliveries view polls every 6 s through the helper the other views use: a list
    answered with an `ETag` is asked for again with it, and a `304` keeps the rows shown. (The
    tag is added here by the test, for a server whose outbox list has none yet.)"""
    listed = f"{console.url}/api/v1/outbox?status=dead&limit=100"
    tag = '"deliveries-1"'
    sent: list[str | None] = []

    def tagged(route: Any) -> None:
        sent.append(route.request.headers.get("if-none-match"))
        if route.request.headers.get("if-none-match") == tag:
            route.fulfill(status=304, headers={"ETag": tag})
            return
        answer = route.fetch()
        route.fulfill(response=answer, headers={**answer.headers, "etag": tag})

    page.route(listed, tagged)
    page.goto(f"{console.url}/console#/deliveries?status=dead")
    expect(page.locator("#delivery-rows")).not_to_contain_text("Loading")
    shown = page.locator("#delivery-rows").inner_text()
    with page.expect_response(lambda r: r.url == listed and r.status == 304, timeout=10_000):
        pass  # the next poll
    assert sent[:2] == [None, tag]
    expect(page.locator("#delivery-rows")).to_have_text(shown)
