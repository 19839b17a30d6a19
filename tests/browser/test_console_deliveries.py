"""The console's deliveries to the business backend in a real headless chromium against a real
API, worker and sweeper: a task's dead letters shown, retried and discarded with who and why,
and the deliveries view across tasks, one row or every dead one at once.

Tests run in file order on one fleet.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, shot
from tests.browser.pages import (
    dead_letter_deliveries,
    delivery_row,
    failing_alone,
    more_events,
    open_task,
    set_rows,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_dead_lettered_delivery_is_shown_and_retried(page: Any, console: Console) -> None:
    """The business backend never took the task's event: the page says so (attempts, throttled,
    the error) and an operator sends it again from there."""
    task_id = console.trigger("xss", "A webhook the backend refused")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    first, *_ = dead_letter_deliveries(console, task_id)
    open_task(page, console, task_id)
    card = page.locator("#deliveries")
    expect(card).to_contain_text("Task events")
    expect(card).to_contain_text("dead")
    expect(card).to_contain_text("8 (2 throttled)")
    expect(card).to_contain_text("HTTP 503")
    shot(page, "dead-delivery")
    page.locator(f'button[data-retry="{first}"]').click()
    expect(page.locator("#op-result")).to_have_text(f"Delivery {first} is due again.")
    expect(page.locator(f'button[data-retry="{first}"]')).to_have_count(0)
    rows = console.http.get("/api/v1/outbox", params={"task_id": task_id}).json()["items"]
    retried = next(row for row in rows if row["outbox_id"] == first)
    assert (retried["status"], retried["attempts"], retried["throttled"]) == ("pending", 0, 0)


def test_a_dead_letter_dealt_with_by_hand_is_discarded_with_who_and_why(
    page: Any, console: Console
) -> None:
    """The backend will never take the event (a 422 for those bytes): the operator, having told
    it by hand, discards it with a reason; it is then listed as discarded, by whom and why."""
    task_id = console.trigger("approval", "The backend refuses this event for good")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    first, *rest = dead_letter_deliveries(console, task_id)
    assert rest  # action_proposed, then waiting
    held_back(console, rest)
    # The later events are due but wait in order: the task's page names the dead letter.
    open_task(page, console, task_id)
    expect(page.locator("#deliveries .waits-behind").first).to_have_text(
        f"waits behind dead letter {first}"
    )
    page.goto(f"{console.url}/console#/deliveries?status=dead")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    form = page.locator(f'form[data-discard="{first}"]')
    form.locator(f"#discard-by-{first}").fill("duty engineer")
    form.locator(f"#discard-reason-{first}").fill("   ")  # a blank reason is not sent
    form.locator("button").click()
    expect(page.locator("#delivery-result")).to_have_text("A reason is needed.")
    form.locator(f"#discard-reason-{first}").fill("told the backend by phone")
    form.locator("button").click()
    expect(page.locator("#delivery-result")).to_have_text(
        f"Delivery {first} is discarded: the task's later events go on."
    )
    expect(page.locator(f'form[data-discard="{first}"]')).to_have_count(0)
    rows = console.http.get("/api/v1/outbox", params={"task_id": task_id}).json()["items"]
    discarded = next(row for row in rows if row["outbox_id"] == first)
    assert (discarded["status"], discarded["discarded_by"]) == ("discarded", "duty engineer")
    assert all(row["status"] == "pending" for row in rows if row["outbox_id"] in rest)
    page.select_option("#d-status", "discarded")
    page.click("#delivery-filters button")
    row = page.locator("#delivery-rows tbody tr", has_text=task_id)
    expect(row).to_have_count(1)
    note = row.locator(".discarded")
    expect(note).to_contain_text("discarded by duty engineer ")
    expect(note).to_contain_text(": told the backend by phone")
    expect(row.locator("td").nth(5)).to_have_text("—")  # no next attempt: never sent again
    shot(page, "deliveries-discarded")
    open_task(page, console, task_id)
    expect(page.locator("#deliveries")).to_contain_text("discarded 1")
    expect(page.locator("#deliveries .waits-behind")).to_have_count(0)


def held_back(console: Console, ids: list[int]) -> None:
    """These deliveries as the task's later events are behind a dead letter: never attempted."""
    from sqlalchemy import update

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.outbox_id.in_(ids))
                .values(status="pending", attempts=0, throttled=0, last_error=None)
            )
    finally:
        db.dispose()


def test_the_deliveries_view_lists_dead_ones_across_tasks_and_retries_them(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("xss", "Its event never reached the backend")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    first, *_ = dead_letter_deliveries(console, task_id)
    page.goto(f"{console.url}/console")
    page.click("#nav-deliveries")
    expect(page.locator("h1")).to_have_text("Deliveries to the business backend")
    row = page.locator("#delivery-rows tbody tr", has=page.locator(f'button[data-retry="{first}"]'))
    expect(row).to_contain_text(task_id)
    expect(row).to_contain_text("8 (2 throttled)")
    expect(row).to_contain_text("HTTP 503")
    shot(page, "deliveries-dead")
    row.locator("button[data-retry]").click()
    expect(page.locator("#delivery-result")).to_have_text(f"Delivery {first} is due again.")
    expect(page.locator(f'button[data-retry="{first}"]')).to_have_count(0)
    # The same row among the pending ones, with fresh counts; the task link leads to the task.
    page.select_option("#d-status", "pending")
    page.click("#delivery-filters button")
    pending = page.locator("#delivery-rows tbody tr", has_text=task_id)
    expect(pending).to_contain_text("pending")
    expect(pending.locator("td").nth(4)).to_have_text("0")
    pending.get_by_role("link").click()
    expect(page.locator("#task-title")).to_have_text("Its event never reached the backend")
    # A hand-edited address the filters cannot hold lists the dead ones of any kind, and says
    # so (it listed them unsaid, `status=failed` reading as the failed ones).
    page.goto(f"{console.url}/console#/deliveries?status=failed&kind=email")
    expect(page.locator("#delivery-ignored")).to_have_text(
        "Not understood, so not applied: status=failed (one of dead, pending, delivered, "
        "discarded); kind=email (action or webhook)."
    )
    expect(page.locator("#d-status")).to_have_value("dead")
    page.click("#delivery-filters button")
    expect(page.locator("#delivery-ignored")).to_have_count(0)


def test_every_dead_delivery_is_retried_at_once_from_the_deliveries_view(
    page: Any, console: Console
) -> None:
    """After a backend refused everything (a secret rotated on one side), one button makes
    every dead delivery of the kind shown due again, as `outbox retry --all-dead` does."""
    task_id = console.trigger("xss", "Every event refused")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    dead = dead_letter_deliveries(console, task_id)
    page.goto(f"{console.url}/console#/deliveries?status=dead&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    expect(page.locator(f'button[data-retry="{dead[0]}"]')).to_have_count(1)
    page.click("#retry-every-dead")
    said = page.locator("#delivery-result")
    expect(said).to_contain_text("dead task event deliveries are due again.")
    for number in dead:
        expect(page.locator(f'button[data-retry="{number}"]')).to_have_count(0)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    expect(page.locator("#retry-every-dead")).to_have_count(0)  # only over dead ones


def test_the_deliveries_view_says_which_dead_letter_a_pending_event_waits_behind(
    page: Any, console: Console
) -> None:
    """A task's later events are due but held in order behind its dead letter: the pending
    deliveries view read "next attempt <a time past>", which looked like a stuck dispatcher.
    It names the dead letter, with its Retry (once) and its task's page to discard it."""
    task_id = console.trigger("approval", "Its later events wait behind a dead letter")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    first, *rest = dead_letter_deliveries(console, task_id)
    assert rest
    held_back(console, rest)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    rows = page.locator("#delivery-rows tbody tr", has_text=task_id)
    expect(rows).to_have_count(len(rest))
    waits = rows.locator(".waits-behind")
    expect(waits).to_have_count(len(rest))
    for number in range(len(rest)):
        expect(waits.nth(number)).to_contain_text(f"waits behind dead letter {first}")
    expect(rows.locator(f'a[href="#/task/{task_id}"]', has_text="discard")).to_have_count(len(rest))
    retry = page.locator(f'button[data-retry="{first}"]')
    expect(retry).to_have_count(1)  # one Retry for the dead letter, not one per event behind it
    shot(page, "deliveries-waits-behind")
    retry.click()
    expect(page.locator("#delivery-result")).to_have_text(f"Delivery {first} is due again.")
    # No longer behind a dead letter: behind the retried one, sent first (it is pending again).
    expect(waits).to_have_text([f"waits behind delivery {first}, being retried"] * len(rest))
    expect(rows).to_have_count(len(rest) + 1)  # the dead letter itself is pending again
    listed = console.http.get("/api/v1/outbox", params={"task_id": task_id}).json()["items"]
    assert {row["outbox_id"]: row["status"] for row in listed}[first] == "pending"


def test_a_pending_event_behind_an_earlier_one_being_retried_says_so(
    page: Any, console: Console
) -> None:
    """A receiver failing every time, not yet dead: the task's first event is pending and
    retried, and its later events are held back in order behind it. They read "next attempt
    <a time past>" and never attempted (as if nothing sent them), in the deliveries view and
    on the task's page; both now name the delivery they wait behind."""
    task_id = console.trigger("approval", "Its receiver fails every time")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    first, *rest = dead_letter_deliveries(console, task_id)
    assert rest
    held_back(console, rest)
    failing(console, first)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    rows = page.locator("#delivery-rows tbody tr", has_text=task_id)
    expect(rows).to_have_count(len(rest) + 1)
    waits = rows.locator(".waits-behind")
    expect(waits).to_have_count(len(rest))  # not the first: it is the one being retried
    expect(waits.first).to_have_text(f"waits behind delivery {first}, being retried")
    open_task(page, console, task_id)
    behind = page.locator("#deliveries .waits-behind")
    expect(behind).to_have_count(len(rest))
    expect(behind.first).to_have_text(f"waits behind delivery {first}, being retried")


def failing(console: Console, outbox_id: int) -> None:
    """The delivery as a dispatcher leaves it after two failed attempts: pending, retried."""
    from sqlalchemy import update

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.outbox_id == outbox_id)
                .values(status="pending", attempts=2, throttled=0, last_error="HTTP 503")
            )
    finally:
        db.dispose()


def test_a_dead_letter_says_why_it_was_dead_lettered(page: Any, console: Console) -> None:
    """A dead letter's last error alone (`HTTP 503`) read as one more failure to be retried: the
    console says why it is dead (`dead_reason`), out of attempts or refused for good, on the
    deliveries view and the task's page alike; a refusal once, since its error says it."""
    task_id = console.trigger("xss", "Out of attempts, or refused")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    more_events(console, task_id, 1)
    refused, spent, *_ = dead_letter_deliveries(console, task_id)  # 8 attempts, 2 throttled
    refusal = "HTTP 422 (a permanent refusal, not retried)"
    set_rows(console, {refused: {"attempts": 1, "throttled": 0, "last_error": refusal}})
    page.goto(f"{console.url}/console#/deliveries?status=dead")
    for where in ("#delivery-rows", "#deliveries"):
        expect(delivery_row(page, where, spent)).to_contain_text(
            "HTTP 503 (out of attempts (6 failed))"
        )
        # A refusal's error says so: said once, not again as "(refused, never retried)".
        row = delivery_row(page, where, refused)
        expect(row).to_contain_text(refusal)
        assert row.locator(".dead-reason").count() == 0
        assert row.inner_text().count("retried") == 1
        if where == "#delivery-rows":
            shot(page, "deliveries-dead-reason")
            page.goto(f"{console.url}/console#/task/{task_id}")


def test_an_event_behind_one_being_retried_says_what_the_api_says(
    page: Any, console: Console
) -> None:
    """The console names the delivery a pending event waits behind as the API does
    (`waits_behind_retried`, as `outbox list` and `tasks show` print it), not by a rule of its
    own over the rows it lists: here the task's first event is delivered and its second keeps
    failing, so the third waits behind the second, the earliest of the task not sent. The
    task's page draws its view's field, which one function computes for both views."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "An event behind a failing one")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    more_events(console, task_id, 2)
    first, failing, behind, *_ = dead_letter_deliveries(console, task_id)
    fresh = {"status": "pending", "attempts": 0, "throttled": 0, "last_error": None}
    set_rows(console, {first: {**fresh, "status": "delivered", "delivered_at": utcnow()},
                       behind: fresh,
                       failing: {**fresh, "attempts": 2, "last_error": "HTTP 503"}})  # fmt: skip
    rows = console.http.get("/api/v1/outbox", params={"task_id": task_id}).json()["items"]
    said = {row["outbox_id"]: row["waits_behind_retried"] for row in rows}
    assert (said[first], said[failing], said[behind]) == (None, None, failing)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    where = "#delivery-rows"
    expect(delivery_row(page, where, behind).locator(".waits-behind")).to_have_text(
        f"waits behind delivery {failing}, being retried"
    )
    expect(delivery_row(page, where, failing).locator(".waits-behind")).to_have_count(0)
    open_task(page, console, task_id)
    expect(page.locator("#deliveries .waits-behind")).to_have_text(
        [f"waits behind delivery {failing}, being retried"]
    )


def test_a_failing_pending_delivery_is_retried_or_discarded_with_who(
    page: Any, console: Console
) -> None:
    """The API retries (due now, counts kept) or discards a failing delivery still pending, as
    `outbox retry N` and `outbox discard N` do; the console offered both on dead rows only, so
    an approved action the backend answers 500 for every time was sent for ever from there.
    The row says who retried it, when, with what note, and a discarded one that it was pending."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "Its receiver fails every time")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    number = failing_alone(console, task_id)
    open_task(page, console, task_id)
    expect(page.locator(f'#deliveries button[data-retry="{number}"]')).to_have_count(1)
    expect(page.locator(f'#deliveries form[data-discard="{number}"]')).to_have_count(1)
    page.evaluate("localStorage.setItem('orch.by', 'duty engineer')")  # this browser's name
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    row = delivery_row(page, "#delivery-rows", number)
    row.locator(f'button[data-retry="{number}"]').click()
    expect(page.locator("#delivery-result")).to_have_text(f"Delivery {number} is due again.")
    expect(row.locator(".retried")).to_contain_text("retried by duty engineer ")
    expect(row.locator("button, form")).to_have_count(0)  # due now: its dispatcher's turn
    # Its next attempt failed too, and backs off; the retry had a note (`outbox retry --note`).
    later = utcnow() + timedelta(minutes=10)
    set_rows(console, {number: {"retry_note": "backend mended", "next_attempt_at": later}})
    page.reload()
    expect(row.locator(".retried")).to_contain_text(": backend mended")
    form = row.locator(f'form[data-discard="{number}"]')
    form.locator(f"#discard-reason-{number}").fill("told the backend by phone")
    form.locator("button").click()
    expect(page.locator("#delivery-result")).to_have_text(
        f"Delivery {number} is discarded: the task's later events go on."
    )
    page.goto(f"{console.url}/console#/deliveries?status=discarded&kind=webhook")
    row = delivery_row(page, "#delivery-rows", number)
    expect(row.locator(".discarded")).to_contain_text(
        "(it was pending, not dead-lettered): told the backend by phone"
    )
    expect(row.locator(".retried")).to_contain_text("retried by duty engineer ")
    shot(page, "deliveries-failing-discarded")


#: From now on, until `window.__releaseList()`, the page's reads of the deliveries list wait
#: unsent (a poll would draw the row afresh before the click), then go, as later ones do.
HOLD_LIST = """
() => {
  const real = window.fetch.bind(window);
  const waiting = [];
  let held = true;
  window.__releaseList = () => { held = false; waiting.splice(0).forEach((go) => go()); };
  window.fetch = (input, init) => {
    const url = new URL(String(input), location.href);
    if (!held || url.pathname !== "/api/v1/outbox") return real(input, init);
    return new Promise((resolve) => waiting.push(resolve)).then(() => real(input, init));
  };
}
"""


def test_a_delivery_being_sent_says_so_and_a_refused_retry_says_why(
    page: Any, console: Console
) -> None:
    """A row a dispatcher is sending offers no Retry nor Discard (the API refuses both, `409
    being_sent`) and says "being sent now"; one that became so after the page drew it is
    refused in a line that says what happened and what to do, not as a generic error."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "A send held by a dispatcher")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    number = failing_alone(console, task_id)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()  # the view, not the last one
    row = delivery_row(page, "#delivery-rows", number)
    retry = row.locator(f'button[data-retry="{number}"]')
    expect(retry).to_have_count(1)
    # The view's reads of the list wait in the page: the row stays as drawn until the click.
    page.evaluate(HOLD_LIST)
    posted = {"claimed_until": utcnow() + timedelta(minutes=10), "sending_since": utcnow()}
    set_rows(console, {number: posted})
    retry.click()
    expect(page.locator("#delivery-result")).to_have_text(
        f"Delivery {number} is being sent now: its answer is recorded when the attempt ends; "
        "retry it then if it failed."
    )
    page.evaluate("window.__releaseList()")
    expect(row.locator(".being-sent")).to_contain_text("being sent now (attempt 2, held until ")
    expect(row.locator(".being-sent")).to_contain_text(", posted at ")
    expect(row.locator("button, form")).to_have_count(0)
    open_task(page, console, task_id)
    expect(delivery_row(page, "#deliveries", number).locator(".being-sent")).to_have_count(1)
    expect(page.locator(f'#deliveries button[data-retry="{number}"]')).to_have_count(0)
    expect(page.locator(f'#deliveries form[data-discard="{number}"]')).to_have_count(0)


def test_a_delivery_claimed_in_a_batch_waits_its_turn_and_says_so(
    page: Any, console: Console
) -> None:
    """A dispatcher claims a batch of rows and posts them one after another (`sending_since`
    is set as it posts each): every claimed row read "being sent now", the ones still waiting
    their turn too. Such a row says it waits its turn in its batch and offers Discard alone: its
    dispatcher checks the row again before it posts it, and skips it; a retry would not send it
    sooner (the API refuses it), and a refused retry says why in those words."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "A send waiting in a dispatcher's batch")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    number = failing_alone(console, task_id)
    page.goto(f"{console.url}/console#/deliveries?status=pending&kind=webhook")
    expect(page.locator("#delivery-filters")).to_be_visible()
    row = delivery_row(page, "#delivery-rows", number)
    retry = row.locator(f'button[data-retry="{number}"]')
    expect(retry).to_have_count(1)
    page.evaluate(HOLD_LIST)
    set_rows(console, {number: {"claimed_until": utcnow() + timedelta(minutes=10)}})
    retry.click()
    expect(page.locator("#delivery-result")).to_have_text(
        f"Delivery {number} is claimed by a dispatcher and waits its turn in its batch: it is "
        "posted when its turn comes, and a retry would not send it sooner; discard it if it "
        "must not be sent."
    )
    page.evaluate("window.__releaseList()")
    expect(row.locator(".being-sent")).to_contain_text(
        "claimed by a dispatcher: waits its turn in its batch (attempt 2, held until "
    )
    expect(row.locator(".being-sent")).not_to_contain_text("being sent now")
    expect(row.locator(f'button[data-retry="{number}"]')).to_have_count(0)
    expect(row.locator(f'form[data-discard="{number}"]')).to_have_count(1)
    open_task(page, console, task_id)
    waiting = delivery_row(page, "#deliveries", number)
    expect(waiting.locator(".waiting-turn")).to_have_count(1)
    expect(waiting.locator(f'button[data-retry="{number}"]')).to_have_count(0)
    form = waiting.locator(f'form[data-discard="{number}"]')
    form.locator(f"#discard-by-{number}").fill("duty engineer")
    form.locator(f"#discard-reason-{number}").fill("the backend already has it")
    form.locator("button").click()
    expect(page.locator("#op-result")).to_have_text(
        f"Delivery {number} is discarded: the task's later events go on."
    )
    row = console.http.get(f"/api/v1/outbox/{number}").json()
    assert (row["status"], row["discarded_from"]) == ("discarded", "pending"), row


def test_a_send_whose_claim_ran_out_is_offered_again_without_a_reload(
    page: Any, console: Console
) -> None:
    """A dispatcher stopped mid-send: its claim's hold runs out and the row is due again, but
    nothing in the rows changes, so the task's page (its view unchanged, 304) kept saying
    "being sent now", with no Retry nor Discard, until a reload."""
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "A dispatcher stopped mid-send")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    number = failing_alone(console, task_id)
    set_rows(
        console,
        {number: {"claimed_until": utcnow() + timedelta(seconds=3), "sending_since": utcnow()}},
    )
    open_task(page, console, task_id)
    row = delivery_row(page, "#deliveries", number)
    expect(row.locator(".being-sent")).to_have_count(1)
    expect(row.locator(f'button[data-retry="{number}"]')).to_have_count(1, timeout=8_000)
    expect(row.locator(".being-sent")).to_have_count(0)
