"""An API that takes connections but does not answer (its process stopped, a proxy or a
network holding the request) in a real headless chromium: the console says it is not
answering, as for one that refuses connections, instead of showing the last rows read as if
fresh."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_api_that_does_not_answer_is_said_on_the_task_list(page: Any, console: Console) -> None:
    """Before, every poll waited for ever: the list stayed as last read, its "(N min ago)"
    ticking on as if refreshed, with no word that nothing had been read since."""
    task_id = console.trigger("xss", "Listed before the API hung")
    page.goto(f"{console.url}/console#/")
    expect(page.locator("#task-rows")).to_contain_text("Listed before the API hung")
    assert console.process is not None
    os.kill(console.process.pid, signal.SIGSTOP)
    try:
        banner = page.locator("#banner")
        expect(banner).to_have_text(
            "The API is not answering (nothing in 10 s); retrying…", timeout=25_000
        )
        expect(page.locator("#task-rows")).to_contain_text("Listed before the API hung")
        shot(page, "api-hung")
    finally:
        os.kill(console.process.pid, signal.SIGCONT)
    expect(page.locator("#banner")).to_be_hidden(timeout=25_000)
    console.wait_for(task_id, lambda t: t["status"] == "completed")
