"""The console's forms against a real API, worker and sweeper in a real headless chromium: a
field takes as much as the API accepts, so what a person types in full is not refused after
they press the button.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from tests.browser.pages import open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: The API's limit on a human step's evidence and reason (api/human_steps.py).
STEP_TEXT_MAX = 1500


def test_a_human_step_s_evidence_and_reason_stop_at_what_the_api_takes(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("steps", "Long crew notes")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    # A crew's notes pasted in: the field keeps what the API takes, and the step closes
    # (before, the field took 2,000 characters and the API refused the step with a 422).
    page.locator('button.node[data-node="sample"]').click()
    page.fill("#node-by", "crew lead")
    page.focus("#node-reason")
    page.keyboard.insert_text("r" * (STEP_TEXT_MAX + 100))
    assert len(page.input_value("#node-reason")) == STEP_TEXT_MAX
    page.click("#node-fail")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node failed.")
    page.locator('button.node[data-node="callback"]').click()
    page.focus("#node-evidence")
    page.keyboard.insert_text("e" * (STEP_TEXT_MAX + 100))
    assert len(page.input_value("#node-evidence")) == STEP_TEXT_MAX
    page.click("#node-complete")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node completed.")
    nodes = {
        n["id"]: n
        for n in console.http.get(f"/api/v1/tasks/{task_id}/plan").json()["plan"]["nodes"]
    }
    assert nodes["sample"]["reason"].startswith("r" * STEP_TEXT_MAX)  # then who and when
    assert nodes["callback"]["evidence"].startswith("e" * STEP_TEXT_MAX)
