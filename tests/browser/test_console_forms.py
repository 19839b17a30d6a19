"""The console's forms against a real API, worker and sweeper in a real headless chromium: a
field takes as much as the API accepts, so what a person types in full is not refused after
they press the button, and what they type survives the page's polling.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from orchestrator.domain.storable import NAME_MAX
from orchestrator.services.operator_requests import STEP_TEXT_MAX
from tests.browser.conftest import Console
from tests.browser.pages import hold_answer, hold_request, open_task

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_human_step_s_evidence_and_reason_stop_at_what_the_api_takes(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("steps", "Long crew notes")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    # A crew's notes pasted in: the field keeps what the API takes, and the step closes
    # (before, the field took 2,000 characters and the API refused the step with a 422).
    page.locator('button.node[data-node="sample"]').click()
    # Who acts (the shared token's `by`) stops at NAME_MAX too, and is recorded whole.
    page.fill("#node-by", "")
    page.focus("#node-by")
    page.keyboard.insert_text("c" * (NAME_MAX + 20))
    assert len(page.input_value("#node-by")) == NAME_MAX
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
    assert f"by {'c' * NAME_MAX} at " in nodes["sample"]["reason"]
    assert nodes["callback"]["evidence"].startswith("e" * STEP_TEXT_MAX)


def test_an_approver_s_typing_survives_a_new_action_arriving(page: Any, console: Console) -> None:
    first = console.trigger("approval", "Approve while typing")
    console.wait_for(first, lambda t: t["status"] == "waiting")
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator("article.action").filter(has_text=first)
    card.locator("input[name=by]").fill("duty engineer")
    card.locator("input[name=note]").fill("crew north confirmed by phone")
    card.locator("input[name=note]").focus()
    top = card.bounding_box()["y"]
    # Another task proposes an action while the approver types: its card appears below (the
    # oldest waits at the top), and the one being filled in keeps its place, its text and the
    # focus (before, every card was drawn again, the new one on top).
    second = console.trigger("approval", "Arrives meanwhile")
    console.wait_for(second, lambda t: t["status"] == "waiting")
    expect(page.locator("article.action").filter(has_text=second)).to_be_visible()
    assert card.bounding_box()["y"] == top
    expect(card.locator("input[name=note]")).to_have_value("crew north confirmed by phone")
    expect(card.locator("input[name=by]")).to_have_value("duty engineer")
    expect(card.locator("input[name=note]")).to_be_focused()
    page.keyboard.type(", go")
    card.locator("button.approve").click()
    # The card leaves the list; the page says what was decided.
    expect(page.locator("#approvals")).not_to_contain_text(first)
    expect(page.locator("#approvals-result")).to_have_text(
        f"Approved: work_order for node flush of task {first}."
    )
    decided = console.http.get("/api/v1/actions", params={"status": "approved", "task_id": first})
    [action] = decided.json()["items"]
    assert action["note"] == "crew north confirmed by phone, go"


def test_a_task_that_does_not_exist_offers_no_form(page: Any, console: Console) -> None:
    page.goto(f"{console.url}/console#/task/no-such-task-4f2a")
    expect(page.locator("#task-error")).to_have_text("No such task: no-such-task-4f2a.")
    # Before: the error sat above Requeue and Cancel forms, empty sections and a plan
    # "connecting" for ever.
    expect(page.locator("#requeue-form")).to_have_count(0)
    expect(page.locator("#live")).to_have_count(0)
    page.locator("main a", has_text="Tasks").click()
    expect(page.locator("#task-rows")).to_be_visible()
    # A link mangled into bad percent-encoding: said the same way (before, an uncaught
    # "URI malformed" left the task list up).
    page.goto(f"{console.url}/console#/task/%ZZ")
    expect(page.locator("#task-error")).to_have_text("No such task: %ZZ.")


def test_approvals_page_counts_every_pending_action_and_shows_the_oldest_first(
    page: Any, console: Console
) -> None:
    """More pending actions than a page: the page says how many wait and shows the oldest, the
    most urgent, at the top, a page at a time (before, it fetched every pending action, page
    after page, at each refresh, and said nowhere how many there were)."""
    import uuid
    from datetime import timedelta

    from sqlalchemy import delete, insert, select

    from orchestrator.store import Database
    from orchestrator.store.tables import actions

    task_id = console.trigger("approval", "One of many waiting")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    seeded: list[dict[str, Any]] = []
    try:
        with db.transaction() as conn:
            mine = select(actions).where(actions.c.task_id == task_id)
            row = dict(conn.execute(mine).mappings().one())
            seeded += [
                row | {"action_id": f"many-{uuid.uuid4()}", "payload": {"what": f"waiting #{n}"},
                       "created_at": row["created_at"] - timedelta(minutes=250 - n)}
                for n in range(250)
            ]  # fmt: skip
            conn.execute(insert(actions), seeded)
        listed: list[str] = []
        page.on(
            "request",
            lambda r: listed.append(r.url) if "/api/v1/actions?" in r.url else None,
        )
        # Other tests of the module may leave actions pending: 251 of ours and theirs.
        pending = console.http.get("/api/v1/actions/pending-count").json()["pending"]
        assert pending >= 251
        page.goto(f"{console.url}/console#/approvals")
        cards = page.locator("#approvals > article.action")
        expect(page.locator("#approvals-count")).to_have_text(
            f"{pending} pending; the 50 oldest are shown, the longest waiting first."
        )
        expect(cards).to_have_count(50)
        expect(cards.first.locator("pre")).to_contain_text('"waiting #0"')
        expect(cards.nth(49).locator("pre")).to_contain_text('"waiting #49"')
        # One request of 50 rows drew the page, not every pending action.
        [request] = listed
        assert "limit=50" in request
        assert "order=oldest" in request
        page.click("#approvals-more")
        expect(cards).to_have_count(100)
        expect(cards.nth(99).locator("pre")).to_contain_text('"waiting #99"')
        expect(cards.first.locator("pre")).to_contain_text('"waiting #0"')
        # The task's own page lists them all too, oldest first.
        page.goto(f"{console.url}/console#/task/{task_id}")
        mine = page.locator("#pending-actions > article.action")
        expect(mine).to_have_count(251)
        expect(mine.first.locator("pre")).to_contain_text('"waiting #0"')
    finally:
        with db.transaction() as conn:  # the other tests' approvals page stays short
            conn.execute(
                delete(actions).where(actions.c.action_id.in_([s["action_id"] for s in seeded]))
            )
        db.dispose()


def test_a_write_clicked_twice_on_a_slow_api_is_sent_once(page: Any, console: Console) -> None:
    """The requeue's answer is slow to come: its button waits, disabled, and a second click
    sends nothing (before, it sent the requeue again, and the first requeue's generation was
    superseded by a second for nothing); once answered, the button is offered again."""
    task_id = console.trigger("xss", "Requeued on a slow API")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    requeue = f"/api/v1/tasks/{task_id}/requeue"
    hold_answer(page, requeue)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.method) if r.url.endswith(requeue) else None)
    open_task(page, console, task_id)
    page.fill("#requeue-reason", "look again")
    button = page.locator("#requeue-form button")
    button.click()
    page.wait_for_function("() => window.__release !== undefined")  # answered, held
    expect(button).to_be_disabled()
    button.click(force=True)  # as a second click would
    page.locator("#requeue-reason").press("Enter")  # or Enter in the reason
    page.evaluate("() => window.__release()")
    expect(page.locator("#op-result")).to_have_text("Requeue: done.")
    expect(button).to_be_enabled()
    assert sent == ["POST"]


def test_a_human_step_on_its_way_says_so_and_stays_held_when_redrawn(
    page: Any, console: Console
) -> None:
    """While a person's step is on its way its buttons wait, disabled, and "sending…" says why
    (before, nothing did); the step's form drawn again meanwhile (the node clicked again, a poll
    or the stream) waits too, where before its new buttons were offered and sent it again."""
    task_id = console.trigger("steps", "A step sent on a slow network")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    complete = f"/api/v1/tasks/{task_id}/nodes/sample/complete"
    hold_request(page, complete)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.method) if r.url.endswith(complete) else None)
    open_task(page, console, task_id)
    page.locator('button.node[data-node="sample"]').click()
    page.fill("#node-by", "crew lead")
    page.fill("#node-evidence", "tap 3 sampled at 09:10")
    page.click("#node-complete")
    page.wait_for_function("() => window.__send !== undefined")  # asked, not sent yet
    form = page.locator("#human-node")
    expect(form.locator(".sending")).to_have_text(" sending…")
    expect(page.locator("#node-complete")).to_be_disabled()
    page.locator('button.node[data-node="sample"]').click()  # the form drawn again
    expect(form.locator(".sending")).to_have_text(" sending…")
    for button in ("#node-complete", "#node-fail", "#node-skip"):
        expect(page.locator(button)).to_be_disabled()
    page.click("#node-complete", force=True)  # as a second click would
    page.evaluate("() => window.__send()")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node completed.")
    expect(page.locator(".sending")).to_have_count(0)
    assert sent == ["POST"]
