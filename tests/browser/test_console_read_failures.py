"""What the console says when it cannot read what a view shows, in a real headless chromium
against a real API, worker and sweeper: a read the API refuses or the network drops is said
where its content would be, with a way to read it again, and an address the console has no
view for says so.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from tests.browser.pages import open_task, pause_clock

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: A task's pending actions, as its page reads them.
PENDING = re.compile(r".*/api/v1/actions\?status=pending_approval&limit=200&task_id=.*")


def test_a_task_s_pending_actions_that_cannot_be_read_say_so_and_are_read_again(
    page: Any, console: Console
) -> None:
    """The page's read of the task's pending actions failed (a 503, then the network dropped):
    the section stayed empty and said nothing, as if nothing waited for approval. It says the
    read failed, why, and offers to read them again; read, the card is shown. The page's clock
    is stopped: its poll (every 3 s) read the mended approvals before the click on Retry once,
    under load, and the button was gone."""
    task_id = console.trigger("approval", "Its approvals cannot be read")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    refused = {"error": {"code": "store_unavailable", "message": "The store is not answering"}}
    page.route(PENDING, lambda route: route.fulfill(status=503, json=refused))
    pause_clock(page)
    open_task(page, console, task_id)
    said = page.locator("#pending-error")
    expect(said).to_have_text(
        "The pending approvals could not be read: The store is not answering "
        "(store_unavailable). Retry"
    )
    page.unroute(PENDING)
    page.route(PENDING, lambda route: route.abort("connectionreset"))
    said.get_by_role("button", name="Retry").click()
    expect(said).to_have_text(
        "The pending approvals could not be read: The API is not answering. Retry"
    )
    page.unroute(PENDING)
    said.get_by_role("button", name="Retry").click()
    expect(page.locator("#pending-actions > article[data-action]")).to_have_count(1)
    expect(said).to_have_count(0)


#: The approvals page's read of the oldest pending actions.
OLDEST = re.compile(r".*/api/v1/actions\?status=pending_approval&order=oldest&.*")


def test_the_approvals_page_that_cannot_read_them_says_so_and_reads_them_again(
    page: Any, console: Console
) -> None:
    """The approvals page's read that failed was said as text alone, in place of the cards:
    no way to read them again but a reload. It says so as the task page's pending approvals
    do, with Retry; read, the card is shown; a poll that fails later keeps the cards shown.
    The page's clock is stopped: its poll (every 6 s) runs only when the test says, never
    between the read mended and the click on Retry."""
    task_id = console.trigger("approval", "The approvals page cannot read it")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    refused = {"error": {"code": "store_unavailable", "message": "The store is not answering"}}
    page.route(OLDEST, lambda route: route.fulfill(status=503, json=refused))
    pause_clock(page)
    page.goto(f"{console.url}/console#/approvals")
    said = page.locator("#approvals-error")
    expect(said).to_have_text(
        "The pending approvals could not be read: The store is not answering "
        "(store_unavailable). Retry"
    )
    expect(page.locator("#approvals")).not_to_contain_text("Loading")
    page.unroute(OLDEST)
    said.get_by_role("button", name="Retry").click()
    card = page.locator("#approvals > article.action").filter(has_text=task_id)
    expect(card).to_have_count(1)
    expect(said).to_have_count(0)
    page.route(OLDEST, lambda route: route.abort("connectionreset"))
    page.clock.fast_forward(6_000)  # the next poll
    expect(said).to_have_text(
        "The pending approvals could not be read: The API is not answering. Retry"
    )
    expect(card).to_have_count(1)  # as last read


#: The approvals page's read of how many actions are pending.
COUNT = re.compile(r".*/api/v1/actions/pending-count$")


def test_the_approvals_page_whose_count_cannot_be_read_says_so(page: Any, console: Console) -> None:
    """The count's read failed while the cards were read: its line was left blank, as if
    nothing were said to be pending. It says the count could not be read, and how many cards
    are shown; read again, the count is back."""
    task_id = console.trigger("approval", "Its count cannot be read")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    refused = {"error": {"code": "store_unavailable", "message": "The store is not answering"}}
    page.route(COUNT, lambda route: route.fulfill(status=503, json=refused))
    pause_clock(page)
    page.goto(f"{console.url}/console#/approvals")
    expect(page.locator("#approvals > article.action").filter(has_text=task_id)).to_have_count(1)
    shown = page.locator("#approvals > article.action").count()  # the file's other tasks too
    expect(page.locator("#approvals-count")).to_have_text(
        "How many are pending could not be read: The store is not answering "
        f"(store_unavailable). {shown} shown, the longest waiting first."
    )
    page.unroute(COUNT)
    page.clock.fast_forward(6_000)  # the next poll
    pending = console.http.get("/api/v1/actions/pending-count").json()["pending"]
    assert pending >= shown
    expect(page.locator("#approvals-count")).to_contain_text(f"{pending} pending")


def test_an_address_the_console_has_no_view_for_says_so(page: Any, console: Console) -> None:
    """A mistyped or stale address (a view the console does not have, a task address with a
    slash too many) drew the task list, unsaid, as if it were what was asked for: it says there
    is no such page, with a link back to the tasks; a known view with a query still opens."""
    for address in ("#/nonsense", "#/task/", "#/task/a/b", "#/deliveries/dead", "#/%ZZ"):
        page.goto(f"{console.url}/console{address}")
        expect(page.locator("h1")).to_have_text("No such page")
        expect(page.locator("#no-such-page")).to_contain_text("The console has no page at ")
        expect(page.locator("#task-rows")).to_have_count(0)
        expect(page.locator("nav [aria-current]")).to_have_count(0)
    page.get_by_role("link", name="Back to the tasks").click()
    expect(page.locator("h1")).to_have_text("Tasks")
    assert page.url.endswith("#/")
    page.goto(f"{console.url}/console#/approvals?x=1")
    expect(page.locator("h1")).to_have_text("Pending approvals")
