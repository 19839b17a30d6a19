"""What a task's claims rest on, in a real headless chromium against a real API, worker and
sweeper: the evidence ids a completed node and the report cite are the ids the Evidence
section lists, so an operator can tell which record (and of which origin) backs a claim.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from tests.browser.pages import open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_completed_node_s_cited_evidence_is_the_record_listed(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("retried", "What backs the fetch")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    [record] = console.http.get(f"/api/v1/tasks/{task_id}/evidence").json()["items"]
    cited = record["evidence_id"]
    open_task(page, console, task_id)
    # The record under its id, beside its origin (before: source, origin, time, summary and a
    # content digest, but not the id everything cites).
    row = page.locator("#evidence tr").filter(has=page.locator(f'code[data-evidence="{cited}"]'))
    expect(row).to_have_count(1)
    expect(row).to_contain_text("synthetic")
    # The completed retry cites it (before: its evidence text only, no id).
    page.locator('button.node[data-node="fetch-2"]').click()
    expect(page.locator("#node-detail .cites")).to_have_text(cited)
    # The report cites the same id.
    expect(page.locator("#report ul.refs")).to_contain_text(cited)
