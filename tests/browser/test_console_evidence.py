"""What a task's claims rest on, in a real headless chromium against a real API, worker and
sweeper: the evidence ids a completed node and the report cite are the ids the Evidence
section lists, so an operator can tell which record (and of which origin) backs a claim; and
with more records than a page, the one they cite is still on the page, and "Show more" appends.
"""

from __future__ import annotations

from datetime import timedelta
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


def older_records(console: Console, task_id: str, count: int) -> None:
    """`count` records of the task's first session, all older than what it has: its own
    record comes after them, on a later page."""
    from sqlalchemy import func, insert, select

    from orchestrator.store import Database
    from orchestrator.store.tables import evidence

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            first = conn.execute(
                select(evidence.c.session_id, func.min(evidence.c.created_at))
                .where(evidence.c.task_id == task_id)
                .group_by(evidence.c.session_id)
            ).first()
            assert first is not None
            session_id, oldest = first
            start = oldest - timedelta(hours=1)
            conn.execute(
                insert(evidence),
                [
                    {
                        "evidence_id": f"older-{n:04d}",
                        "task_id": task_id,
                        "generation": 1,
                        "session_id": session_id,
                        "source": "scada_sim",
                        "queried_at": start,
                        "content_ref": f"sha256:{n:064x}",
                        "origin": "live",
                        "truncated": False,
                        "summary": f"an older read {n}",
                        "created_at": start + timedelta(milliseconds=n),
                    }
                    for n in range(count)
                ],
            )
    finally:
        db.dispose()


def test_show_more_appends_the_next_page_and_a_cited_record_further_on_is_shown(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("retried", "What backs the fetch")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    [record] = console.http.get(f"/api/v1/tasks/{task_id}/evidence").json()["items"]
    cited = record["evidence_id"]
    older_records(console, task_id, 250)  # the cited record is the 251st: on the third page
    open_task(page, console, task_id)
    rows = page.locator("#evidence-list tbody tr")
    # The first page only (before: all 251 records at once), and the cited record apart.
    expect(rows).to_have_count(100)
    expect(rows.first).to_contain_text("older-0000")
    expect(page.locator(f'#evidence-list code[data-evidence="{cited}"]')).to_have_count(0)
    apart = page.locator("#evidence-cited tr").filter(
        has=page.locator(f'code[data-evidence="{cited}"]')
    )
    expect(apart).to_have_count(1)
    expect(apart).to_contain_text("synthetic")
    # The node's citation leads to it.
    page.locator('button.node[data-node="fetch-2"]').click()
    page.locator(f'#node-detail a.cite[data-cite="{cited}"]').click()
    expect(apart).to_be_focused()
    # "Show more" appends the next page below the rows shown, which stay.
    kept = rows.first.element_handle()
    page.locator("#evidence-more").click()
    expect(rows).to_have_count(200)
    expect(rows.nth(100)).to_contain_text("older-0100")
    assert kept.evaluate("row => row.isConnected")
    expect(page.locator("#evidence-shown")).to_have_text("the 200 oldest are shown")
    # The last page holds the cited record: in the list now, listed once, and no more to show.
    page.locator("#evidence-more").click()
    expect(rows).to_have_count(251)
    expect(page.locator(f'#evidence code[data-evidence="{cited}"]')).to_have_count(1)
    expect(rows.last).to_contain_text(cited)
    expect(page.locator("#evidence-cited")).to_have_count(0)
    expect(page.locator("#evidence-more")).to_have_count(0)
    # The report's citation leads to the record where it is now.
    page.locator(f'#report ul.refs a.cite[data-cite="{cited}"]').click()
    expect(rows.last).to_be_focused()
