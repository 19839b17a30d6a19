"""The console signed in with operator tokens (ORCH_OPERATORS), and the task list paging on the
server, in a real headless chromium against a real API, worker and sweeper."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATORS, Console, shot
from tests.browser.pages import dead_letter_deliveries

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WRITE = """async (path) => {
  const r = await fetch(path, {method: 'POST', credentials: 'same-origin',
    headers: {'X-Orch-Console': '1', 'Content-Type': 'application/json'},
    body: JSON.stringify({reason: 'from the page', by: 'someone else'})});
  return [r.status, (await r.json()).error?.code ?? null];
}"""


def token(name: str) -> str:
    return OPERATORS[name][1]


def test_an_approver_signs_in_by_form_and_approves_as_itself(
    browser: Any, console: Console
) -> None:
    task_id = console.trigger("approval", "Approve as alma")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    context = browser.new_context()
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console")
        tab.fill("#token", token("alma"))
        tab.click("#signin-form button")
        expect(tab.locator("h1")).to_have_text("Tasks")
        expect(tab.locator("#whoami-name")).to_have_text("alma")
        expect(tab.locator("#whoami-role")).to_have_text("approver")
        assert token("alma") not in tab.url + tab.content()
        cookie = next(c for c in context.cookies() if c["name"] == "orch_console")
        assert token("alma") not in cookie["value"]
        tab.goto(f"{console.url}/console#/approvals")
        card = tab.locator("article.action").filter(has_text=task_id)
        expect(card.locator(".acting-as")).to_have_text("Acting as alma")
        assert card.locator("input[name=by]:visible").count() == 0  # no name to type
        card.locator("input[name=note]").fill("approved in the console")
        shot(tab, "approvals-as-approver")
        card.locator("button.approve").click()
        expect(tab.locator("#approvals")).not_to_contain_text(task_id)
    finally:
        context.close()
    decided = console.http.get("/api/v1/actions", params={"status": "approved", "task_id": task_id})
    [action] = decided.json()["items"]
    assert (action["decided_by"], action["note"]) == ("alma", "approved in the console")
    assert token("alma") not in console.api_log()


def test_a_viewer_reads_and_is_offered_no_write(browser: Any, console: Console) -> None:
    task_id = console.trigger("approval", "Only looked at")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console?token={token('vera')}")
        expect(tab.locator("#whoami-name")).to_have_text("vera")
        expect(tab.locator("#whoami-role")).to_have_text("viewer")
        assert tab.url.endswith("/console")
        tab.goto(f"{console.url}/console#/task/{task_id}")
        expect(tab.locator("#task-title")).to_have_text("Only looked at")
        expect(tab.locator("#pending-actions article.action")).to_have_count(1)
        expect(tab.locator("#pending-actions .role-note")).to_contain_text("approver role")
        assert tab.locator("#pending-actions button.approve").count() == 0
        expect(tab.locator(".role-note").first).to_contain_text("Signed in as vera (viewer)")
        assert tab.locator("#requeue-form, #cancel-form").count() == 0
        # A dead-lettered delivery is shown, its retry not offered.
        dead = dead_letter_deliveries(console, task_id)
        tab.reload()
        expect(tab.locator("#deliveries")).to_contain_text("HTTP 503")
        expect(tab.locator("#deliveries .role-note")).to_contain_text("operator role")
        assert tab.locator("#deliveries button[data-retry]").count() == 0
        assert tab.locator("#deliveries form[data-discard]").count() == 0
        assert tab.evaluate(WRITE, f"api/v1/outbox/{dead[0]}/discard") == [403, "forbidden"]
        assert tab.evaluate(WRITE, f"api/v1/outbox/{dead[0]}/retry") == [403, "forbidden"]
        shot(tab, "task-detail-as-viewer")
        # The page offers nothing, and the API refuses what a script would try anyway.
        assert tab.evaluate(WRITE, f"api/v1/tasks/{task_id}/requeue") == [403, "forbidden"]
        assert tab.evaluate("fetch('api/v1/tasks').then(r => r.status)") == 200
    finally:
        context.close()
    assert console.task(task_id)["generation"] == 1
    assert token("vera") not in console.api_log()


def test_an_operator_requeues_but_does_not_decide(browser: Any, console: Console) -> None:
    task_id = console.trigger("approval", "Requeued by otto")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console?token={token('otto')}")
        expect(tab.locator("#whoami-role")).to_have_text("operator")
        tab.goto(f"{console.url}/console#/task/{task_id}")
        expect(tab.locator("#pending-actions .role-note")).to_contain_text("approver role")
        tab.fill("#requeue-reason", "a second look")
        tab.click("#requeue-form button")
        expect(tab.locator("#op-result")).to_have_text("Requeue: done.")
        listing = f"api/v1/actions?task_id={task_id}"
        assert tab.evaluate(f"fetch('{listing}').then(r => r.status)") == 200
    finally:
        context.close()
    # Requeued: generation 2 runs (the script then goes on to later generations at once).
    console.wait_for(task_id, lambda t: t["generation"] >= 2)


def test_a_refused_token_link_leaves_no_token_in_the_address_bar(
    browser: Any, console: Console
) -> None:
    """A link with a mistyped token shows the sign-in form at a URL without it: the token is
    neither left in the address bar nor in the tab's history for the next person at the desk."""
    context = browser.new_context()
    tab = context.new_page()
    typo = token("otto")[:-1] + "x"
    try:
        tab.goto(f"{console.url}/console?token={typo}&status=failed")
        expect(tab.locator("p.error")).to_contain_text("not accepted")
        assert typo not in tab.url
        assert "status=failed" in tab.url
        assert typo not in tab.evaluate("document.documentElement.outerHTML")
    finally:
        context.close()


def test_the_task_list_filters_and_pages_on_the_server(page: Any, console: Console) -> None:
    titles = {f"Paged {n}" for n in range(5)}
    for title in sorted(titles):
        task_id = console.trigger("pager", title)
        # Settled, so that every page read again is a 304: Newer back to a page read before
        # showed the page left under every poll while the list's tags did not change.
        console.wait_for(task_id, lambda t: t["status"] not in ("queued", "running"))
    page.goto(f"{console.url}/console#/?type=pager&limit=2")
    rows = page.locator("#task-rows a.task-link")
    seen: list[str] = []
    for number in (1, 2, 3):
        expect(page.locator("#page-number")).to_have_text(f"page {number}")
        expect(rows).to_have_count(2 if number < 3 else 1)
        seen += rows.all_inner_texts()
        if number < 3:
            page.click("#next-page")
    assert page.locator("#next-page").count() == 0
    assert sorted(seen) == sorted(titles)  # every task once, none from another type
    page.click("#prev-page")
    expect(page.locator("#page-number")).to_have_text("page 2")
    expect(rows).to_have_count(2)
    # A filter the server refuses is said, not shown as an empty list.
    page.fill("#f-type", "not a type")
    page.click("#filters button")
    expect(page.locator("#list-error")).to_contain_text("task_type")
    page.goto(f"{console.url}/console#/?type=pager&since=1h&status=failed")
    expect(page.locator("#task-rows")).to_have_text("No tasks match.")


def test_the_task_list_takes_a_time_range_in_local_time(page: Any, console: Console) -> None:
    task_id = console.trigger("ranged", "In range")

    def local(hours: float) -> str:  # what a datetime-local field holds (the browser's zone)
        return (datetime.now() + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")

    rows = page.locator("#task-rows a.task-link")
    hour_ago, in_an_hour, two_hours_ago = local(-1), local(1), local(-2)  # once: minutes turn
    page.goto(f"{console.url}/console#/?type=ranged&to={hour_ago}")
    expect(page.locator("#task-rows")).to_have_text("No tasks match.")
    page.goto(f"{console.url}/console#/?type=ranged")
    expect(rows).to_have_count(1)
    page.fill("#f-from", hour_ago)
    page.fill("#f-to", in_an_hour)
    page.click("#filters button")
    expect(rows).to_have_count(1)
    hash_query = parse_qs(page.evaluate("location.hash").split("?", 1)[1])
    assert hash_query == {"type": ["ranged"], "from": [hour_ago], "to": [in_an_hour]}
    expect(rows).to_have_count(1)
    expect(rows).to_have_attribute("href", f"#/task/{task_id}")
    # The inputs keep the range, and To before From is refused by the API, said in words.
    expect(page.locator("#f-from")).to_have_value(hour_ago)
    page.fill("#f-to", two_hours_ago)
    page.click("#filters button")
    expect(page.locator("#list-error")).to_contain_text("created_after must be earlier")
    # A hand-edited address with a time the field cannot hold is ignored, not an error, and
    # said, so that an unfiltered list does not pass for a filtered one.
    page.goto(f"{console.url}/console#/?type=ranged&from=yesterday&since=5y&status=broken")
    expect(rows).to_have_count(1)
    expect(page.locator("#f-from")).to_have_value("")
    ignored = page.locator("#filter-ignored")
    expect(ignored).to_contain_text("from=yesterday")
    expect(ignored).to_contain_text("since=5y")
    expect(ignored).to_contain_text("status=broken")
    page.goto(f"{console.url}/console#/?type=ranged&since=24h")
    expect(rows).to_have_count(1)
    expect(page.locator("#filter-ignored")).to_have_count(0)
    # A page size the list cannot take, as well (it listed 50, or 200, unsaid).
    for size in ("abc", "0", "500"):
        page.goto(f"{console.url}/console#/?type=ranged&limit={size}")
        expect(ignored).to_have_text(
            f"Not understood, so not applied: limit={size} (a page size from 1 to 200)."
        )
        expect(rows).to_have_count(1)
    page.goto(f"{console.url}/console#/?type=ranged&limit=200")
    expect(rows).to_have_count(1)
    expect(page.locator("#filter-ignored")).to_have_count(0)


def test_a_token_link_on_another_site_asks_before_signing_in(
    browser: Any, console: Console
) -> None:
    """Login CSRF by link: another site's link to `/console?token=<its account's token>` no
    longer signs the person in as that account unasked."""
    context = browser.new_context()
    tab = context.new_page()
    try:
        elsewhere = console.url.replace("127.0.0.1", "localhost")  # another site to the browser
        tab.goto(f"{elsewhere}/healthz")
        link = f"{console.url}/console?token={token('otto')}"
        tab.evaluate(
            "(href) => { const a = document.createElement('a'); a.href = href; a.id = 'lure';"
            " a.textContent = 'open'; document.body.append(a); }",
            link,
        )
        tab.click("#lure")
        expect(tab.locator("h1")).to_have_text("Sign in as otto?")
        assert not any(c["name"] == "orch_console" for c in context.cookies())
        assert token("otto") not in tab.content()
        assert token("otto") not in tab.url  # not in the address bar while it asks
        tab.click("#confirm-form button")
        expect(tab.locator("#whoami-name")).to_have_text("otto")
        assert tab.url.endswith("/console")
    finally:
        context.close()
    assert token("otto") not in console.api_log()


def test_signing_in_goes_back_to_the_view_asked_for(browser: Any, console: Console) -> None:
    """A task's page opened without a session shows the sign-in form, and signing in shows
    that task's page; so does signing in again after the session ended while the page was
    open (here signed out from another browser holding the cookie). Before, both landed on
    the task list: the view is in the address's fragment, which the form's redirect dropped."""
    task_id = console.trigger("xss", "Opened before signing in")
    context = browser.new_context()
    other = browser.new_context()
    tab = context.new_page()
    title = tab.locator("#task-title")
    try:
        tab.goto(f"{console.url}/console#/task/{task_id}")
        tab.fill("#token", token("otto"))
        tab.click("#signin-form button")
        expect(title).to_have_text("Opened before signing in")
        assert tab.url == f"{console.url}/console#/task/{task_id}"
        other.add_cookies(context.cookies())
        elsewhere = other.new_page()
        elsewhere.goto(f"{console.url}/console")
        elsewhere.click("#signout button")
        expect(elsewhere.locator("#signin-form")).to_be_visible()
        expect(tab.locator("#signin-form")).to_be_visible()  # at the page's next poll
        tab.fill("#token", token("otto"))
        tab.click("#signin-form button")
        expect(title).to_have_text("Opened before signing in")
        assert tab.url == f"{console.url}/console#/task/{task_id}"
    finally:
        other.close()
        context.close()
