"""The console's flows in a real headless chromium against a real API, worker and sweeper:
signing in, following a task live, deciding actions and writes, closing human steps, and
coming back after the API restarts. How text and layout render is in test_console_rendering.py;
deliveries to the business backend are in test_console_deliveries.py.

Tests run in file order on one fleet.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import TOKEN, Console, shot
from tests.browser.pages import open_task, transcript_entry
from tests.browser.scripts import HELD, XSS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def complete_human_node_in_console(page: Any, node_id: str, evidence: str, by: str) -> Any:
    """For the lead, once POST /api/v1/tasks/{id}/nodes/{node}/complete is merged: select the
    human node on an open task page, complete it with `evidence`, return the result locator."""
    page.locator(f'button.node[data-node="{node_id}"]').click()
    page.fill("#node-by", by)
    page.fill("#node-evidence", evidence)
    page.click("#node-complete")
    return page.locator("#node-detail .node-result")


def test_sign_in_by_form_then_by_token_url_and_sign_out(browser: Any, console: Console) -> None:
    context = browser.new_context()
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console")
        expect(tab.locator("#signin-form")).to_be_visible()
        tab.fill("#token", "not-the-token")
        tab.click("#signin-form button")
        expect(tab.locator(".error")).to_have_text("That token is not accepted.")
        tab.fill("#token", TOKEN)
        tab.click("#signin-form button")
        expect(tab.locator("h1")).to_have_text("Tasks")
        cookie = next(c for c in context.cookies() if c["name"] == "orch_console")
        assert cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        tab.click("#signout button")
        expect(tab.locator("#signin-form")).to_be_visible()
    finally:
        context.close()

    context = browser.new_context()
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console?token={TOKEN}&status=running")
        expect(tab.locator("h1")).to_have_text("Tasks")
        assert TOKEN not in tab.url
        assert tab.url.endswith("/console?status=running")
        assert TOKEN not in tab.content()
        # The cookie, not a bearer header, authenticates the console's own API calls.
        assert tab.evaluate("fetch('api/v1/tasks').then(r => r.status)") == 200
    finally:
        context.close()
    assert TOKEN not in console.api_log()
    # The sign-in line is logged with its token masked (orchestrator.logs masks every token=).
    assert "GET /console?token=***" in console.api_log()


def test_list_to_detail_with_the_plan_updating_live(page: Any, console: Console) -> None:
    task_id = console.trigger("live", "Watch me live")
    page.goto(f"{console.url}/console")
    link = page.get_by_role("link", name="Watch me live")
    expect(link).to_be_visible()
    page.evaluate("window.__same_page = true")
    link.click()
    expect(page.locator("#task-title")).to_have_text("Watch me live")
    # Revisions arrive on the stream while the worker runs; the page never reloads.
    expect(page.locator("#plan")).to_contain_text("revision 2", timeout=30_000)
    expect(page.locator("#live")).to_have_text("live")
    counts = page.locator("#status-counts")
    expect(counts).to_contain_text("completed 1")
    expect(counts).to_contain_text("running 2")
    assert "%" not in counts.inner_text()
    expect(page.locator("ol.layers > li")).to_have_count(4)  # a, b|c, d, e
    expect(page.locator("ol.layers > li").nth(1).locator("button.node")).to_have_count(2)
    expect(page.locator("svg.edges path")).to_have_count(5)
    shot(page, "task-detail-running")
    # Version switching (seed 004): an earlier revision stays on screen while the live plan
    # moves on underneath, and the picker offers the new revision.
    page.select_option("#plan-revision", "1")
    expect(page.locator("#plan-old")).to_contain_text("the plan is at 2")
    expect(counts).to_contain_text("running 1")
    expect(counts).to_contain_text("pending 4")
    page.locator('button.node[data-node="b"]').click()
    expect(page.locator("#node-detail")).to_contain_text("pending")
    # "live" while the task runs; the report follows the last revision within a moment.
    expect(page.locator('#plan-revision option[value="3"]')).to_have_text(
        re.compile(r"^3 \(latest(, live)?\)$"), timeout=30_000
    )
    expect(page.locator("#plan-revision")).to_have_value("1")
    expect(counts).to_contain_text("pending 4")
    shot(page, "task-detail-earlier-revision")
    page.click("#plan-latest")
    expect(page.locator("#plan-old")).to_have_count(0)
    expect(page.locator("#plan-revision")).to_have_value("3")
    expect(page.locator('#plan-revision option[value="3"]')).to_have_text("3 (latest)")
    expect(page.locator("#plan")).to_contain_text("revision 3", timeout=30_000)
    expect(counts).to_contain_text("completed 5")
    expect(page.locator("#task-head")).to_contain_text("completed", timeout=30_000)
    expect(page.locator("#report-summary")).to_have_text("all five steps done")
    expect(page.locator("#generations")).to_contain_text("completed")
    worker = console.task(task_id)["executions"][0]["worker"]
    expect(page.locator("#generations")).to_contain_text(worker)
    assert page.evaluate("window.__same_page") is True
    shot(page, "task-detail-completed")

    # Filters: by status and by type.
    page.goto(f"{console.url}/console#/?status=completed&type=live")
    expect(page.get_by_role("link", name="Watch me live")).to_be_visible()
    page.select_option("#f-status", "failed")
    page.click("#filters button")
    expect(page.locator("#task-rows")).to_have_text("No tasks match.")


def test_evidence_and_transcript_follow_the_task_s_writes(page: Any, console: Console) -> None:
    """A page opened before the round queried anything shows the evidence its report cites,
    and the transcript, as the report arrives: not at the next slow poll (every 15 s), which
    left "No evidence recorded." beside a completed report citing evidence."""
    task_id = console.trigger("records", "Cite what you read")
    page.goto(f"{console.url}/console#/task/{task_id}")
    expect(page.locator("#evidence")).to_have_text("No evidence recorded.")
    expect(page.locator("#report-summary")).to_have_text("cited what it queried", timeout=30_000)
    expect(page.locator("#evidence")).to_contain_text("scada_sim", timeout=2_000)
    expect(page.locator("#transcript li[data-entry]").first).to_be_visible(timeout=2_000)
    assert console.task(task_id)["status"] == "completed"


def test_approving_an_action(page: Any, console: Console) -> None:
    task_id = console.trigger("approval", "Approve the flush")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator("article.action").filter(has_text=task_id)
    expect(card).to_contain_text("flush the hydrant on Mill Lane")
    expect(card.locator(".digest, .muted").first).to_be_visible()
    shot(page, "approvals")
    card.locator("input[name=by]").fill("duty engineer")
    card.locator("input[name=note]").fill("go ahead")
    card.locator("button.approve").click()
    expect(page.locator("#approvals")).not_to_contain_text(task_id)
    decided = console.http.get("/api/v1/actions", params={"status": "approved", "task_id": task_id})
    body = decided.json()
    [action] = body.get("items", body.get("actions"))  # the list envelope, or the old key
    assert (action["decided_by"], action["note"]) == ("duty engineer", "go ahead")


def test_requeue_and_cancel_with_a_reason(page: Any, console: Console) -> None:
    done = console.trigger("xss", "Run me again")
    console.wait_for(done, lambda t: t["status"] == "completed")
    open_task(page, console, done)
    page.fill("#requeue-reason", "the district meter was recalibrated")
    page.click("#requeue-form button")
    expect(page.locator("#op-result")).to_have_text("Requeue: done.")
    # The script's second round re-cites evidence under a completed node, which the plan rules
    # refuse, so it runs on to the round limit within a second or two: wait for generation 2
    # or any later one.
    requeued = console.wait_for(done, lambda t: t["generation"] >= 2)
    assert [x["generation"] for x in requeued["executions"]][:2] == [1, 2]
    expect(page.locator("#generations tbody tr").nth(1)).to_be_visible()

    slow = console.trigger("slow", "Cancel me")
    console.wait_for(slow, lambda t: t["status"] == "running")
    open_task(page, console, slow)
    page.click("#cancel-form button")  # no reason: the form refuses to send
    assert page.locator("#cancel-reason:invalid").count() == 1
    assert console.task(slow)["status"] == "running"
    page.fill("#cancel-reason", "the customer withdrew the complaint")
    page.click("#cancel-form button")
    expect(page.locator("#task-head .badge").first).to_have_text("cancelled")
    assert console.task(slow)["last_error"] == "the customer withdrew the complaint"


def test_a_requeued_task_is_followed_live_again(page: Any, console: Console) -> None:
    slow = console.trigger("slow", "Cancel me, then requeue me")
    console.wait_for(slow, lambda t: t["status"] == "running")
    open_task(page, console, slow)
    expect(page.locator("#live")).to_have_text("live")
    page.fill("#cancel-reason", "the wrong district")
    page.click("#cancel-form button")
    expect(page.locator("#live")).to_have_text("ended")
    page.fill("#requeue-reason", "the right district after all")
    page.click("#requeue-form button")
    console.wait_for(slow, lambda t: t["generation"] == 2 and t["status"] == "running")
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#task-head .badge").first).to_have_text("running")
    page.fill("#cancel-reason", "done looking")  # frees the worker's slot for the next tests
    page.click("#cancel-form button")
    expect(page.locator("#live")).to_have_text("ended")


def test_an_operator_resolves_an_unknown_write(page: Any, console: Console) -> None:
    from orchestrator.store import Database
    from orchestrator.store.receipts import ReceiptLedger
    from tests.integration.receipt_rows import claim_arguments

    task_id = console.trigger("xss", "A write nobody can verify")
    task = console.wait_for(task_id, lambda t: t["status"] == "completed")
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:  # a write whose answer was lost: the host cannot say whether it happened
        ledger = ReceiptLedger(db)
        claim = ledger.claim(**claim_arguments(task["session_id"], owner=f"task:{task_id}"))
        invocation_id = claim.receipt.invocation_id
        ledger.finish(invocation_id, claim.receipt.claim_token, status="unknown", summary="s")
    finally:
        db.dispose()
    open_task(page, console, task_id)
    form = page.locator(f'form.resolve[data-invocation="{invocation_id}"]')
    expect(page.locator("#receipts")).to_contain_text("unknown")
    form.locator("button").click()  # no reason: the form refuses to send
    assert form.locator("input[name=reason]:invalid").count() == 1
    assert console.http.get(f"/api/v1/invocations/{invocation_id}").json()["status"] == "unknown"
    form.locator("input[name=by]").fill("duty engineer")
    form.locator("select[name=status]").select_option("failed")
    form.locator("input[name=reason]").fill("the backend has no such order")
    shot(page, "resolve-write")
    form.locator("button").click()
    expect(page.locator("#op-result")).to_have_text(
        f"Invocation {invocation_id} resolved as failed; the task is completed."
    )
    expect(page.locator("#receipts")).to_have_text("No receipt is unknown or pending.")
    receipt = console.http.get(f"/api/v1/invocations/{invocation_id}").json()
    assert receipt["status"] == "failed"
    # The page keeps the resolution: which write, from what to what, who, why.
    row = page.locator("#resolutions tbody tr")
    expect(row).to_have_count(1)
    for text in (invocation_id, "unknown", "failed", "duty engineer", "no such order"):
        expect(row).to_contain_text(text)


def test_the_recovery_snapshot_says_what_the_next_generation_continues_from(
    page: Any, console: Console
) -> None:
    """A round that stopped with a write's outcome unknown: the page lists its calls, the
    unknown one first, and says to verify it read-only before any retry (seed 000)."""
    from orchestrator.domain.recovery import VERIFY_FIRST, CallRecord, Snapshot
    from orchestrator.store import Database
    from orchestrator.store.snapshots import save_snapshot

    task_id = console.trigger("xss", "A round that stopped")
    task = console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    card = page.locator("#recovery")
    expect(card).to_have_text("No earlier round to continue from.")
    calls = [
        CallRecord("q0", "query_data_source", {"source": "scada_sim"}, 1, "succeeded"),
        CallRecord("w1", "call_api", {"operation_id": "createOrder"}, 2, None, "inv-1"),
    ]
    stopped = Snapshot.from_calls(calls, reason="stopped: the lease was lost", generation=1)
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:  # as the round leaves it when its worker loses the lease mid-write
        with db.transaction() as conn:
            save_snapshot(conn, task["session_id"], stopped)
    finally:
        db.dispose()
    expect(card).to_contain_text("stopped: the lease was lost", timeout=10_000)
    expect(card.locator(".notice")).to_have_text(VERIFY_FIRST)
    rows = card.locator("tbody tr")
    expect(rows).to_have_count(2)
    for text in ("w1", "call_api", "unknown", "inv-1", "no result was received"):
        expect(rows.first).to_contain_text(text)
    expect(rows.nth(1)).to_contain_text("query_data_source")
    shot(page, "recovery-snapshot")


def test_a_write_in_flight_is_shown_apart_from_the_unknown_ones(
    page: Any, console: Console
) -> None:
    from orchestrator.store import Database
    from orchestrator.store.receipts import ReceiptLedger
    from tests.integration.receipt_rows import claim_arguments

    task_id = console.trigger("xss", "A write on its way")
    task = console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    expect(page.locator("#running-receipts")).to_be_empty()
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:  # claimed and sent, no answer yet
        claim = ReceiptLedger(db).claim(
            **claim_arguments(task["session_id"], owner=f"task:{task_id}")
        )
    finally:
        db.dispose()
    running = page.locator("#running-receipts")
    expect(running).to_contain_text("Still running (1)", timeout=10_000)
    expect(running).to_contain_text(claim.receipt.invocation_id)
    expect(running).to_contain_text("call_api")
    expect(page.locator("#receipts")).to_have_text("No receipt is unknown or pending.")


def test_human_node_completion_says_when_the_server_lacks_it(page: Any, console: Console) -> None:
    task_id = console.trigger("human", "Crew inspection")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    # A GET changes nothing: 405 when the POST route exists, 404 when it does not.
    probe = console.http.get(f"/api/v1/tasks/{task_id}/nodes/inspect/complete")
    result = complete_human_node_in_console(page, "inspect", "valve looked at", "crew lead")
    if probe.status_code == 404:
        expect(result).to_have_text("Completing human nodes is not available on this server.")
    else:  # the human-loop route is merged: the page completes the node
        expect(result).to_contain_text("completed")
    for pane in ("#evidence", "#transcript"):
        expect(page.locator(pane)).not_to_have_text("")


def test_a_redraw_of_the_step_keeps_what_the_person_typed(page: Any, console: Console) -> None:
    # A refresh or a status change draws the node again; it wiped a half-written reason (and a
    # click on Fail then said "A reason is needed.").
    task_id = console.trigger("human", "Typed before a redraw")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    node = page.locator('button.node[data-node="inspect"]')
    node.click()
    page.fill("#node-by", "crew lead")
    page.fill("#node-reason", "the chamber was")
    node.click()  # the same node drawn again, as a redraw does
    expect(page.locator("#node-reason")).to_have_value("the chamber was")
    expect(page.locator("#node-by")).to_have_value("crew lead")
    page.locator("#node-reason").press("End")
    page.keyboard.type(" flooded")
    node.click()
    expect(page.locator("#node-reason")).to_have_value("the chamber was flooded")
    page.click("#node-fail")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node failed.")


def test_a_failed_human_step_says_it_awaits_a_retry(page: Any, console: Console) -> None:
    task_id = console.trigger("human", "Crew could not get in")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    page.locator('button.node[data-node="inspect"]').click()
    page.fill("#node-by", "crew lead")
    page.fill("#node-reason", "the chamber was flooded")
    page.click("#node-fail")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node failed.")
    # The person's failure queues the agent (to retry the step or report the task failed);
    # this script's agent only repeats itself, but the person's revision stays on the page.
    console.wait_for(task_id, lambda t: t["generation"] >= 2)
    expect(page.locator('button.node[data-node="inspect"] .badge.s-failed')).to_have_count(1)
    page.locator('button.node[data-node="inspect"]').click()
    detail = page.locator("#node-detail")
    expect(detail).to_contain_text("the chamber was flooded")
    expect(detail.locator("dd").filter(has_text="no retry yet")).to_have_count(1)
    shot(page, "failed-human-step")
    # Opened afresh, the page shows the task's latest plan though the current generation has
    # none of its own (this agent's own publishes were refused), and says whose it is.
    console.wait_for(task_id, lambda t: t["status"] == "failed")
    page.reload()
    expect(page.locator("#plan-earlier")).to_contain_text("From generation 1")
    expect(page.locator('button.node[data-node="inspect"] .badge.s-failed')).to_have_count(1)


def test_a_retried_failure_is_counted_as_retried(page: Any, console: Console) -> None:
    task_id = console.trigger("retried", "Second try")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    counts = page.locator("#status-counts")
    expect(counts).to_contain_text("failed 1 (1 retried)")
    expect(counts).to_contain_text("completed 1")
    page.locator('button.node[data-node="fetch"]').click()
    expect(page.locator("#node-detail")).to_contain_text("fetch-2")


def test_a_step_planned_before_the_failure_is_no_retry(page: Any, console: Console) -> None:
    """`sample -> retest` drawn from the start: the edge does not make the retest a retry of
    the sample a person failed; the page says what the host's completion rule goes by."""
    task_id = console.trigger("succession", "Broken bottle")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    page.locator('button.node[data-node="sample"]').click()
    page.fill("#node-by", "crew lead")
    page.fill("#node-reason", "the bottle broke in transit")
    page.click("#node-fail")
    expect(page.locator("#node-detail .node-result")).to_have_text("Node failed.")
    expect(page.locator('button.node[data-node="sample"] .badge.s-failed')).to_have_count(1)
    page.locator('button.node[data-node="sample"]').click()
    detail = page.locator("#node-detail")
    expect(detail.locator("dd").filter(has_text="no retry yet")).to_have_count(1)
    expect(detail.locator("dd").filter(has_text="retest")).to_have_count(0)


def test_node_details_are_reachable_by_keyboard(page: Any, console: Console) -> None:
    task_id = console.trigger("human", "Keyboard only")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    expect(page.locator("button.node")).to_have_count(2)
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('data-node')") == "prepare":
            break
    else:
        raise AssertionError("Tab never reached the node")
    page.keyboard.press("ArrowDown")  # the next node in reading order
    expect(page.locator('button.node[data-node="inspect"]')).to_be_focused()
    page.keyboard.press("Enter")
    detail = page.locator("#node-detail")
    expect(detail).to_be_visible()
    expect(detail).to_be_focused()
    expect(detail).to_contain_text("a crew must look at the valve")
    shot(page, "node-detail-by-keyboard")
    # Escape, from the details or a field in them, goes back to the node in the graph.
    page.keyboard.press("Escape")
    expect(page.locator('button.node[data-node="inspect"]')).to_be_focused()
    page.keyboard.press("Enter")
    page.locator("#node-detail input, #node-detail textarea").first.focus()
    page.keyboard.press("Escape")
    expect(page.locator('button.node[data-node="inspect"]')).to_be_focused()
    expect(detail).to_be_visible()


def test_the_plan_stream_fallback_keeps_the_revision_picker_working_across_generations(
    page: Any, console: Console
) -> None:
    """A server without the task stream: the page follows the session's plan stream, and a new
    generation's session replaces it. The revision pinned in the old session must not outlive
    the plan it belongs to: Back to the latest still works in the moment the stream moves."""
    page.route(
        re.compile(r".*/api/v1/tasks/[^/]+/stream$"),
        lambda route: route.fulfill(status=404, json={"detail": "Not Found"}),
    )
    task_id = console.trigger("pinned", "Pinned, then requeued")
    console.wait_for(task_id, lambda t: (t.get("plan") or {}).get("revision") == 2)
    open_task(page, console, task_id)
    expect(page.locator("#live")).to_have_text("live")
    page.select_option("#plan-revision", "1")
    expect(page.locator("#plan-old")).to_contain_text("the plan is at 2")
    requeued = console.http.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "again"})
    assert requeued.status_code == 200, requeued.text
    # Generation 2 publishes nothing of its own: the page says so, then moves to its stream.
    expect(page.locator("#plan-earlier")).to_contain_text("From generation 1")
    page.click("#plan-latest")
    expect(page.locator("#plan-old")).to_have_count(0, timeout=1_000)
    expect(page.locator("#plan-revision")).to_have_value("2", timeout=1_000)
    page.locator('button.node[data-node="b"]').click()
    expect(page.locator("#node-detail")).to_contain_text("running", timeout=1_000)
    cancelled = console.http.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "done"})
    assert cancelled.status_code == 200, cancelled.text


def test_the_page_recovers_after_the_api_restarts(page: Any, console: Console) -> None:
    task_id = console.trigger("live", "Survive a restart")
    open_task(page, console, task_id)
    expect(page.locator("#plan")).to_contain_text(re.compile("revision [12]"), timeout=30_000)
    console.stop_api()
    expect(page.locator("#banner")).to_have_text("The API is not answering; retrying…")
    time.sleep(1)
    console.start_api()
    expect(page.locator("#banner")).to_be_hidden(timeout=15_000)
    # The signed cookie outlives the process; the stream comes back and the plan moves on.
    expect(page.locator("#plan")).to_contain_text("revision 3", timeout=40_000)
    # The stream came back ("live"), or the task already finished and its stream ended for good.
    expect(page.locator("#live")).to_have_text(re.compile("^(live|ended)$"), timeout=15_000)
    expect(page.locator("#task-head")).to_contain_text("completed", timeout=30_000)
    # A finished task's stream is not reopened in a loop: the page says it ended.
    expect(page.locator("#live")).to_have_text("ended", timeout=15_000)


def test_a_compaction_summary_and_an_open_entry_as_the_transcript_grows(
    page: Any, console: Console
) -> None:
    """A summary's text is its `summary` (agent/transcript.py); a running task's transcript is
    drawn again when it grows, and the entry a person opened stays open."""
    task_id = console.trigger("xss", "A transcript that grows")
    summary = {"summary": f"{XSS} the burst", "source": "model", "messages_replaced": 6,
               "tokens_before": 2400, "tokens_after": 300}  # fmt: skip
    first = [transcript_entry(1, "model_turn", {"content": "the meter", "tool_calls": []}),
             transcript_entry(2, "summary", summary)]  # fmt: skip
    later = [*first, transcript_entry(3, "model_turn", {"content": "the valve", "tool_calls": []})]
    grown: list[bool] = []

    def transcript(route: Any) -> None:
        total = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        route.fulfill(status=200, json={
            "task_id": task_id, "generation": None, "next_cursor": None,
            "items": later if grown else first,
            "token_usage": {"generations": [], "total": total}})  # fmt: skip

    page.clock.install()
    page.route(re.compile(r".*/api/v1/tasks/[^/]+/transcript\?.*"), transcript)
    open_task(page, console, task_id)
    page.reload()
    entries = page.locator("#transcript ol.transcript > li")
    expect(entries).to_have_count(2)
    entries.nth(1).locator("summary").click()
    expect(entries.nth(1).locator("pre")).to_have_text(f"{XSS} the burst")
    expect(entries.nth(1)).to_contain_text("replaces 6 message(s): 2400 → 300 tokens")
    grown.append(True)
    page.clock.fast_forward(16_000)  # the transcript's next read
    expect(entries).to_have_count(3)
    expect(entries.nth(1).locator("details")).to_have_attribute("open", "")
    assert page.evaluate("window.__xss") is None


def test_the_earlier_plan_notice_names_the_generation_there_is_now(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("xss", "Requeued twice")
    console.wait_for(task_id, lambda t: t["status"] == "completed")

    def requeue(after: int) -> int:
        """Requeue, and wait for the generations it starts to end (this script's publishes after
        the first generation are refused, so each continues to the round limit, then fails)."""
        response = console.http.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "again"})
        assert response.status_code == 200, response.text
        task = console.wait_for(
            task_id, lambda t: t["generation"] > after and t["status"] == "failed"
        )
        return int(task["generation"])

    generation = requeue(1)
    open_task(page, console, task_id)
    notice = page.locator("#plan-earlier")
    said = "From generation 1: generation {} has published no plan of its own."
    expect(notice).to_have_text(said.format(generation))
    # Their refused publishes are in the transcript with the refusal's code.
    refused = page.locator("#transcript .result-code").filter(has_text="completed_node_changed")
    expect(refused.first).to_be_attached()
    generation = requeue(generation)
    expect(notice).to_have_text(said.format(generation))


def test_a_finished_task_s_page_does_not_reopen_its_stream(page: Any, console: Console) -> None:
    task_id = console.trigger("xss", "Finished and quiet")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if r.url.endswith("/stream") else None)
    open_task(page, console, task_id)
    live = page.locator("#live")
    expect(live).to_have_text("ended")
    shown = set()
    for _ in range(16):  # four seconds: more than a poll, many refreshes of a loop
        shown.add(live.inner_text())
        time.sleep(0.25)
    assert shown == {"ended"}
    assert len(streams) <= 2, streams  # at most the probe and one EventSource


def test_a_human_step_is_closed_only_in_the_live_plan_of_a_task_still_going(
    page: Any, console: Console
) -> None:
    task_id = console.trigger("human", "Closed in the wrong place")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    open_task(page, console, task_id)
    node = page.locator('button.node[data-node="inspect"]')
    node.click()
    expect(page.locator("#human-node")).to_be_visible()
    # A person skips the step elsewhere: revision 2; revision 1 still shows it waiting.
    skipped = console.http.post(
        f"/api/v1/tasks/{task_id}/nodes/inspect/skip", json={"by": "crew", "reason": "no access"}
    )
    assert skipped.status_code == 200, skipped.text
    expect(page.locator('#plan-revision option[value="2"]')).to_be_attached()
    page.select_option("#plan-revision", "1")
    expect(page.locator("#node-detail")).to_contain_text("waiting")
    expect(page.locator("#human-node")).to_have_count(0)
    expect(page.locator("#node-not-here")).to_have_text(
        "An earlier revision: go back to the latest to close this step."
    )
    # A finished task whose step is still open in its plan offers no form either.
    other = console.trigger("human", "Cancelled while a crew was out")
    console.wait_for(other, lambda t: t["status"] == "waiting")
    cancelled = console.http.post(f"/api/v1/tasks/{other}/cancel", json={"reason": "withdrawn"})
    assert cancelled.status_code == 200, cancelled.text
    open_task(page, console, other)
    page.locator('button.node[data-node="inspect"]').click()
    expect(page.locator("#node-detail")).to_contain_text("waiting")
    expect(page.locator("#human-node")).to_have_count(0)
    expect(page.locator("#node-not-here")).to_have_text(
        "The task is cancelled: its steps can no longer be closed."
    )


def test_a_step_is_closed_while_the_next_generation_has_no_plan_yet(
    page: Any, console: Console
) -> None:
    """A person fails the sample: generation 2 is queued and holds (its script never
    publishes). The call-back, in generation 1's plan shown as the task's, can be completed
    there and then (the page said to wait for the next generation's plan)."""
    task_id = console.trigger("steps", "Two people out")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    (console.folder / "scripts" / "steps.json").write_text(json.dumps(HELD), encoding="utf-8")
    try:
        failed = console.http.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/fail", json={"by": "crew", "reason": "dry"}
        )
        assert failed.status_code == 200, failed.text
        assert failed.json()["generation"] == 2
        open_task(page, console, task_id)
        expect(page.locator("#plan-earlier")).to_contain_text("From generation 1")
        result = complete_human_node_in_console(page, "callback", "the water is clear", "desk")
        expect(result).to_have_text("Node completed.")
        expect(page.locator("#node-detail")).to_contain_text("completed by desk at")
        expect(page.locator("#plan-revision")).to_have_value("3")
        assert console.task(task_id)["generation"] == 2
        shot(page, "step-closed-before-the-next-plan")
    finally:
        console.http.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "test over"})


def test_a_reload_restores_the_revision_and_the_node_shown(page: Any, console: Console) -> None:
    """Seed 004's 刷新恢复: the task page, the earlier revision being looked at and the node
    opened come back after a reload; the picker keeps the keyboard focus when a button that
    held it goes away."""
    task_id = console.trigger("human", "Reload me")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    skipped = console.http.post(
        f"/api/v1/tasks/{task_id}/nodes/inspect/skip", json={"by": "crew", "reason": "no access"}
    )
    assert skipped.status_code == 200, skipped.text
    open_task(page, console, task_id)
    picker = page.locator("#plan-revision")
    expect(picker.locator('option[value="2"]')).to_be_attached()
    page.select_option("#plan-revision", "1")
    expect(page.locator("#plan-old")).to_be_visible()
    page.locator('button.node[data-node="inspect"]').click()
    expect(page.locator("#node-detail")).to_contain_text("waiting")
    page.reload()
    expect(page.locator("#task-title")).to_have_text("Reload me")
    expect(picker).to_have_value("1")
    expect(page.locator("#plan-old")).to_contain_text("the plan is at 2")
    expect(page.locator('button.node[data-node="inspect"]')).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(page.locator("#node-detail")).to_contain_text("waiting")
    # By keyboard: Back to the latest goes away when pressed; the focus goes to the picker.
    page.focus("#plan-latest")
    page.keyboard.press("Enter")
    expect(page.locator("#plan-old")).to_have_count(0)
    expect(picker).to_be_focused()
    expect(page.locator("#node-detail")).to_contain_text("skipped")
    page.reload()
    expect(page.locator("#node-detail")).to_contain_text("skipped")
    expect(page.locator("#plan-old")).to_have_count(0)


def test_a_handed_back_round_says_so_in_the_list_and_on_its_page(
    page: Any, console: Console
) -> None:
    """A round its worker handed back (a model server's Retry-After) leaves the task `running`
    with nothing running until the sweeper requeues it: the list and the page say it was handed
    back, until when and why, not only `running`."""
    from orchestrator.store import Database
    from orchestrator.store import executions as execution_store
    from orchestrator.store import generations as generation_store

    (console.folder / "scripts" / "handed.json").write_text(json.dumps(HELD), encoding="utf-8")
    task_id = console.trigger("handed", "A model server rate limiting")
    try:
        console.wait_for(task_id, lambda t: t["status"] == "running" and t["lease"] is not None)
        why = (
            "handed back: the model server is rate limiting (HTTP 429: slow down); requeued in 600s"
        )
        db = Database.from_url(console.env["ORCH_DATABASE_URL"])
        try:  # as the round leaves it when the server's Retry-After outlasts its retries
            with db.transaction() as conn:
                row = execution_store.get_execution(conn, task_id, 1)
                assert row is not None
                assert row.lease_token is not None
                assert generation_store.hand_back(
                    conn, task_id, 1, row.lease_token, after=600, reason=why
                )
        finally:
            db.dispose()
        page.goto(f"{console.url}/console#/")
        listed = page.locator("tr", has=page.locator(f'a[href="#/task/{task_id}"]'))
        expect(listed.locator(".handed-back")).to_contain_text(
            "handed back, requeued after", timeout=10_000
        )
        open_task(page, console, task_id)
        expect(page.locator("#handed-back")).to_contain_text("handed back, requeued after")
        expect(page.locator("#handed-back-reason")).to_have_text(why)
        expect(page.locator("#generations tbody tr").first).to_contain_text("handed back")
        shot(page, "handed-back")
    finally:
        console.http.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "test over"})
