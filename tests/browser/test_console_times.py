"""Times in the console, in a real headless chromium against a real API, worker and sweeper:
each is shown with its zone, and what is past or ahead ("3 min ago", a claim's hold, a backoff's
end, the "last hour" filter) is reckoned against the server's clock (the API's `Date` header),
not the browser's, which may be hours adrift.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import TOKEN, Console, shot
from tests.browser.pages import dead_letter_deliveries, set_rows

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ZONE = "Asia/Shanghai"  # GMT+8, no daylight saving time
AHEAD = 2 * 3600  # the browser's clock, this many seconds ahead of the machine's


@pytest.fixture
def adrift(browser: Any, console: Console) -> Iterator[Any]:
    """A signed-in page in Shanghai whose clock is two hours ahead."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=ZONE)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.clock.install(time=time.time() + AHEAD)  # runs on from there, timers and all
    tab.goto(f"{console.url}/console?token={TOKEN}")
    tab.wait_for_selector("h1")
    yield tab
    context.close()
    assert not errors, errors


def local(at: datetime) -> str:
    """`at` as the console shows it in Shanghai."""
    return at.astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def test_times_have_their_zone_and_durations_follow_the_server_s_clock(
    adrift: Any, console: Console
) -> None:
    """A browser two hours ahead, in Shanghai: times read `12/6/2026, 5:20:00 PM` (which zone?),
    a delivery a dispatcher holds for ten more minutes was offered Retry and Discard (its hold
    looked two hours past; the API refuses both, `409 being_sent`), and "created in the last
    hour" listed nothing. Times now carry their zone and how long ago or ahead they are, by the
    server's clock, and the hold and the filter go by it too."""
    from orchestrator.store.types import utcnow

    page = adrift
    task_id = console.trigger("xss", "Seen from a clock two hours ahead")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    number, *rest = dead_letter_deliveries(console, task_id)
    held = utcnow() + timedelta(minutes=10)
    set_rows(console, {
        number: {"status": "pending", "attempts": 2, "last_error": "HTTP 503",
                 "next_attempt_at": held, "claimed_until": held, "sending_since": utcnow()},
        **{n: {"status": "delivered", "delivered_at": utcnow()} for n in rest},
    })  # fmt: skip
    page.goto(f"{console.url}/console#/task/{task_id}")
    expect(page.locator("#task-title")).to_be_visible()
    created = datetime.fromisoformat(console.task(task_id)["created_at"])
    stamp = page.locator("#task-head dd time").first
    expect(stamp).to_have_text(
        re.compile(rf"^{re.escape(local(created))} GMT\+8 \((just now|\d+ s ago|[1-4] min ago)\)$")
    )
    assert stamp.get_attribute("title") == created.astimezone(ZoneInfo("UTC")).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    row = page.locator("#deliveries tbody tr", has=page.locator(".being-sent"))
    expect(row.locator(".being-sent")).to_have_text(
        re.compile(
            rf"^being sent now \(attempt 2, held until {re.escape(local(held))} GMT\+8 "
            r"\(in (9|10) min\), posted at .* GMT\+8 \((just now|\d+ s ago)\)\)$"
        )
    )
    expect(row.locator("button, form")).to_have_count(0)
    shot(page, "times-zone-and-server-clock")
    page.goto(f"{console.url}/console#/?since=1h")
    expect(page.locator(f'#task-rows a[href="#/task/{task_id}"]')).to_have_count(1)
    expect(page.locator('label[for="f-from"]')).to_have_text("From (GMT+8)")
