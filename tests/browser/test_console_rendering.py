"""The console's rendering in a real headless chromium against a real API, worker and sweeper:
text from a model, a person or the backend is shown as text (markup inert, hidden characters
as markers), records of an older shape are shown as written, and narrow or zoomed pages do
not overflow. The console's flows are in test_console.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import TOKEN, Console, shot
from tests.browser.pages import open_task, transcript_entry
from tests.browser.scripts import RLO, XSS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


NO_OVERFLOW = """() => {
  const doc = document.documentElement;
  const main = document.getElementById('main');
  return {page: doc.scrollWidth - doc.clientWidth, main: main.scrollWidth - main.clientWidth};
}"""


#: How far each table's box scrolls sideways (0: the table fits its card).
SCROLLED = "[...document.querySelectorAll('.scroll')].map((s) => s.scrollWidth - s.clientWidth)"


def test_model_text_is_shown_as_text(page: Any, console: Console) -> None:
    task_id = console.trigger("xss", XSS)
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    expect(page.locator("#plan-title")).to_have_text(XSS)
    expect(page.locator("#task-title")).to_have_text(XSS)
    expect(page.locator("#report-summary")).to_have_text(XSS)
    page.locator('button.node[data-node="a"]').click()
    expect(page.locator("#node-detail")).to_contain_text(XSS)
    # A finished task can be requeued but not cancelled (the API would answer 409).
    expect(page.locator("#requeue-form")).to_be_visible()
    expect(page.locator("#cancel-form")).to_be_hidden()
    # A finding is its text, its origin and the evidence it cites, not an object's JSON.
    finding = page.locator("#report ul.findings li").first
    expect(finding).to_contain_text(XSS)
    expect(finding.locator(".badge")).to_have_text("synthetic")
    expect(finding).not_to_contain_text('"evidence_ids"')
    # The real transcript: four model turns (the query, the plan, the report, the last words)
    # and three results, oldest first; an entry opens on a click and shows its text as text.
    entries = page.locator("#transcript ol.transcript > li")
    expect(entries).to_have_count(7)
    expect(entries.nth(0).locator("summary")).to_contain_text("generation 1 · turn 1")
    expect(entries.nth(1).locator("summary")).to_contain_text("result of query_data_source")
    entries.nth(2).locator("summary").click()
    expect(entries.nth(2).locator("ul.calls code").first).to_have_text("publish_execution_plan")
    expect(entries.nth(2).locator("ul.calls pre")).to_contain_text("onerror")
    entries.nth(6).locator("summary").click()
    expect(entries.nth(6).locator("pre")).to_have_text(XSS)
    shot(page, "transcript")
    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__xss") is None


@pytest.fixture(scope="module")
def finished_task(console: Console) -> str:
    """The title of a completed task with a plan: the live test's, or one of its own when this
    module's tests run alone or in another order."""
    listed = console.http.get("/api/v1/tasks", params={"status": "completed", "task_type": "live"})
    assert listed.status_code == 200, listed.text
    if listed.json()["items"]:
        return str(listed.json()["items"][0]["title"])
    task_id = console.trigger("live", "Watch me live (narrow)")
    console.wait_for(task_id, lambda task: task["status"] == "completed")
    return "Watch me live (narrow)"


@pytest.mark.parametrize(
    ("width", "scale"),
    [(320, 1), (375, 2), (640, 2), (1280, 1)],
    ids=["320px", "375px", "zoom200", "desk"],
)
def test_narrow_and_zoomed_without_horizontal_overflow(
    browser: Any, console: Console, finished_task: str, width: int, scale: int
) -> None:
    # 640 CSS px at device scale 2 is a 1280 px window zoomed to 200 %.
    context = browser.new_context(
        viewport={"width": width, "height": 800}, device_scale_factor=scale
    )
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console?token={TOKEN}")
        expect(tab.locator("#task-rows table")).to_be_visible()
        assert tab.evaluate(NO_OVERFLOW) == {"page": 0, "main": 0}
        assert set(tab.evaluate(SCROLLED)) <= {0}  # and no table wider than its card
        shot(tab, f"list-{width}px-x{scale}")
        link = tab.locator("a.task-link").filter(has_text=finished_task).first
        link.click()
        expect(tab.locator("svg.edges path").first).to_be_attached()
        expect(tab.locator("#generations")).to_contain_text("completed")
        assert tab.evaluate(NO_OVERFLOW) == {"page": 0, "main": 0}
        assert set(tab.evaluate(SCROLLED)) <= {0}
        shot(tab, f"detail-{width}px-x{scale}")
    finally:
        context.close()


def test_host_text_of_other_routes_renders_as_text(page: Any, console: Console) -> None:
    """Evidence summaries are host text and action payloads come from approval scripts: the
    browser answers those routes with script text in them (route interception, in the shapes
    the API returns), so the text-only rule and the approve body are tested for them too."""
    task_id = console.trigger("xss", "Other branches")
    evidence = {"items": [{"source": "scada", "origin": "live", "summary": XSS,
                           "queried_at": "2026-12-04T02:00:00+00:00", "content_ref": "ev-1"}],
                "next_cursor": None}  # fmt: skip
    action = {
        "action_id": "a-1",
        "task_id": task_id,
        "generation": 1,
        "node_id": "flush",
        "kind": "command",
        "payload": {"cmd": XSS},
        "status": "pending_approval",
        "digest": "sha256:feed",
        "created_at": "2026-12-04T02:00:00+00:00",
    }
    approved: list[Any] = []

    def answer(body: Any) -> Any:
        return lambda route: route.fulfill(status=200, json=body)

    def approve(route: Any) -> None:
        approved.append(route.request.post_data_json)
        route.fulfill(status=200, json=action | {"status": "approved"})

    page.route(re.compile(r".*/api/v1/tasks/[^/]+/evidence(\?.*)?$"), answer(evidence))
    page.route(re.compile(r".*/api/v1/actions\?.*"), answer({"items": [action]}))
    page.route(re.compile(r".*/api/v1/actions/a-1/approve$"), approve)
    open_task(page, console, task_id)
    expect(page.locator("#evidence td").filter(has_text=XSS)).to_have_count(1)
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator('article[data-action="a-1"]')
    expect(card.locator(".digest")).to_have_text("sha256:feed")
    expect(card.locator("pre")).to_contain_text("onerror")
    card.locator("input[name=by]").fill("duty engineer")
    card.locator("button.approve").click()
    expect(card.locator(".result")).to_have_text("Approved.")
    assert approved == [{"by": "duty engineer", "digest": "sha256:feed"}]
    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__xss") is None


#: What the console draws for RLO: the override as a marker, the letters in their real order.
RLO_SHOWN = "abc⟦U+202E⟧dcba"
#: Every character the console shows as a marker (app.js HIDDEN), as a JavaScript pattern.
HIDDEN_JS = (
    r"/[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]|\udb40[\udc00-\udc7f]/"
)
HIDDEN_IN_DOM = f"""() => {{
  const hidden = {HIDDEN_JS};
  const found = [];
  const walker = document.createTreeWalker(document.documentElement, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {{
    if (hidden.test(n.data)) found.push(n.data);
  }}
  for (const e of document.querySelectorAll("*")) {{
    for (const a of e.attributes) if (hidden.test(a.value)) found.push(`${{a.name}}=${{a.value}}`);
  }}
  return found;
}}"""
#: The element's characters in logical order with where each is drawn: [char, left, top, bottom].
DRAWN = """(selector) => {
  const chars = [];
  const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    for (let i = 0; i < n.data.length; i += 1) {
      const range = document.createRange();
      range.setStart(n, i);
      range.setEnd(n, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width > 0) chars.push([n.data[i], box.left, box.top, box.bottom]);
    }
  }
  return chars;
}"""
SELECTED = """(selector) => {
  const range = document.createRange();
  range.selectNodeContents(document.querySelector(selector));
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  return getSelection().toString();
}"""


def test_bidi_controls_and_zero_width_characters_are_shown_not_obeyed(
    page: Any, console: Console
) -> None:
    """A right-to-left override in model, tool or backend text would reverse what follows it
    on screen ("Trojan Source"); each such character is drawn as a marker instead, and none
    reaches the page's text or attributes. The model's text comes from a real run; a tool
    result, an evidence summary and an action payload from the routes, as the API returns them."""
    task_id = console.trigger("bidi", f"Task {RLO}")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    result = transcript_entry(99, "tool_result", {"message": f"paid {RLO}", "result": {"to": RLO}})
    result |= {"tool_name": "query_data_source", "status": "succeeded"}

    def transcript(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        body["items"].append(result)
        route.fulfill(response=response, json=body)

    evidence = {"items": [{"source": "scada", "origin": "live", "summary": f"meter {RLO}",
                           "queried_at": "2026-12-04T02:00:00+00:00", "content_ref": "ev-1"}],
                "next_cursor": None}  # fmt: skip
    action = {"action_id": "a-1", "task_id": task_id, "generation": 1, "node_id": "a",
              "kind": "command", "payload": {"cmd": RLO}, "status": "pending_approval",
              "digest": "sha256:feed", "created_at": "2026-12-04T02:00:00+00:00"}  # fmt: skip
    page.route(re.compile(r".*/api/v1/tasks/[^/]+/transcript\?.*"), transcript)
    page.route(
        re.compile(r".*/api/v1/tasks/[^/]+/evidence(\?.*)?$"),
        lambda route: route.fulfill(status=200, json=evidence),
    )
    page.route(
        re.compile(r".*/api/v1/actions\?.*"),
        lambda route: route.fulfill(status=200, json={"items": [action], "next_cursor": None}),
    )
    open_task(page, console, task_id)
    expect(page.locator("#task-title")).to_have_text(f"Task {RLO_SHOWN}")
    expect(page.locator("#plan-title")).to_have_text(f"Plan {RLO_SHOWN}")
    expect(page.locator("#plan-reason")).to_have_text(RLO_SHOWN)
    title = page.locator('button.node[data-node="a"] .title')
    expect(title).to_have_text(RLO_SHOWN)
    expect(page.locator("svg.edges text")).to_have_text(f"if {RLO_SHOWN}")
    expect(page.locator("#report-summary")).to_have_text(RLO_SHOWN)
    expect(page.locator("#report ul.findings li").first).to_contain_text(f"finding {RLO_SHOWN}")
    expect(page.locator("#evidence td").filter(has_text=f"meter {RLO_SHOWN}")).to_have_count(1)
    expect(page.locator("#pending-actions pre")).to_contain_text(f'"cmd": "{RLO_SHOWN}"')
    page.locator('button.node[data-node="a"]').click()
    expect(page.locator("#node-detail")).to_contain_text("pay⟦U+200B⟧ment to ⟦U+2067⟧acct⟦U+2069⟧")
    entries = page.locator("#transcript ol.transcript > li")
    last = entries.last
    expect(last.locator("summary")).to_contain_text("result of query_data_source")
    last.locator("summary").click()
    expect(last.locator("pre").first).to_have_text(f"paid {RLO_SHOWN}")
    expect(last.locator("pre").nth(1)).to_contain_text(f'"to": "{RLO_SHOWN}"')
    model = entries.nth(entries.count() - 2)
    model.locator("summary").click()
    expect(model.locator("pre")).to_have_text(f"done⟦U+FEFF⟧ {RLO_SHOWN}")
    shot(page, "bidi-controls")
    assert page.evaluate(HIDDEN_IN_DOM) == []
    # Drawn left to right in logical order on one line: nothing after the marker is reversed.
    drawn = page.evaluate(DRAWN, 'button.node[data-node="a"] .title')
    assert "".join(c for c, *_ in drawn) == RLO_SHOWN
    assert max(top for *_, top, _ in drawn) < min(bottom for *_, bottom in drawn), drawn
    lefts = [left for _, left, *_ in drawn]
    assert lefts == sorted(lefts), drawn
    assert len(set(lefts)) == len(lefts), drawn
    # The marker stands out from the text around it, and names the character.
    mark = title.locator(".control-char")
    expect(mark).to_have_count(1)
    expect(mark).to_have_attribute("title", re.compile(r"^U\+202E RIGHT-TO-LEFT OVERRIDE"))
    colours = mark.evaluate(
        "m => [getComputedStyle(m).color, getComputedStyle(m.parentElement).color]"
    )
    assert colours[0] != colours[1], colours
    # Copying the text copies what is shown: the marker, not the control.
    assert page.evaluate(SELECTED, 'button.node[data-node="a"] .title') == RLO_SHOWN


def test_records_of_an_older_shape_are_shown_as_written(page: Any, console: Console) -> None:
    """A plan node and edge, an action payload and transcript entries an older version stored
    in another shape reach the console as their JSON text (api/older_shapes.py): the rest of
    the plan is drawn, the odd parts are listed as written, and nothing throws."""
    from sqlalchemy import func, insert, select

    from orchestrator.store.db import Database
    from orchestrator.store.tables import actions, plan_revisions, transcript_entries
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "An older plan")
    task = console.wait_for(task_id, lambda t: t["status"] == "completed")
    plan, session = task["plan"], task["session_id"]
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            conn.execute(insert(plan_revisions).values(
                session_id=session, revision=plan["revision"] + 1, request_id="older",
                schema_version="execution-plan@1", title="An older plan", reason="",
                nodes=[*plan["nodes"], {"id": "old", "title": "no actor", "status": "pending"}],
                edges=[*plan["edges"], ["old", "edge"]], content_digest="0" * 64,
                task_id=task_id, generation=1, updated_at=utcnow()))  # fmt: skip
            conn.execute(insert(actions).values(
                action_id="older-payload", task_id=task_id, generation=1, session_id=session,
                node_id="x", kind="command", payload=["flush", "main 7"],
                status="pending_approval", created_at=utcnow(), digest="0" * 64))  # fmt: skip
            seq = conn.execute(select(func.max(transcript_entries.c.seq)).where(
                transcript_entries.c.session_id == session)).scalar_one()  # fmt: skip
            entry = {"session_id": session, "task_id": task_id, "generation": 1}
            entry |= {"kind": "model_turn", "created_at": utcnow()}
            for n, body in enumerate((["an", "older", "body"], {"tool_calls": [None]}), 1):
                conn.execute(
                    insert(transcript_entries).values(seq=seq + n, turn=90 + n, body=body, **entry)
                )
    finally:
        db.dispose()
    open_task(page, console, task_id)
    expect(page.locator("#plan-title")).to_have_text("An older plan")
    expect(page.locator("#plan-graph button.node")).to_have_count(len(plan["nodes"]))
    older = page.locator("#plan-older pre.unreadable")
    expect(older).to_have_text(['{"id": "old", "status": "pending", "title": "no actor"}',
                                '["old", "edge"]'])  # fmt: skip
    entries = page.locator("#transcript ol.transcript > li")
    expect(entries.last.locator("pre.unreadable")).to_have_count(1, timeout=20_000)
    expect(entries.last.locator("pre.unreadable")).to_have_text("null")
    expect(entries.nth(-2).locator("pre.unreadable")).to_have_text('["an", "older", "body"]')
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator('article[data-action="older-payload"]')
    expect(card.locator("pre.unreadable")).to_have_text('["flush", "main 7"]')


def test_lost_generations_show_both_counts_and_a_hand_back(page: Any, console: Console) -> None:
    """The task's losses in a row of each kind (the two parking rules) and a generation its
    worker handed back after an outage, as the API sends them (set in the store here: a real
    outage is tests/integration/test_handback_budget.py's)."""
    from sqlalchemy import update

    from orchestrator.store.db import Database
    from orchestrator.store.lost import HANDED_BACK
    from orchestrator.store.tables import executions, tasks
    from orchestrator.store.types import utcnow

    task_id = console.trigger("xss", "Lost and found")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(
                recoveries=1, handbacks=2))  # fmt: skip
            conn.execute(update(executions).where(executions.c.task_id == task_id).values(
                outcome="lost", reason=HANDED_BACK, handed_back_at=utcnow()))  # fmt: skip
    finally:
        db.dispose()
    open_task(page, console, task_id)
    lost = page.locator("#task-head dt", has_text="Lost generations").locator("+ dd")
    expect(lost).to_have_text("1 (1 in a row, 2 handed back after outages in a row)")
    expect(page.locator("#generations tbody tr").first).to_contain_text(HANDED_BACK)


def test_events_no_dispatcher_ever_sent_say_so_not_attempts_0(page: Any, console: Console) -> None:
    """This fleet has no ORCH_WEBHOOK_URL: its task events wait unsent. The page says nothing
    of the kind was ever sent from the store, and which setting sends them, not "0 attempts"
    (which read like a stuck dispatcher). No test of this module delivers or dead-letters one."""
    task_id = console.trigger("xss", "Nobody listens")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    card = page.locator("#deliveries")
    expect(card.locator(".never-sent")).to_have_text(
        "No task event webhook in this store was delivered, dead-lettered or tried (delivered "
        "ones are kept ORCH_RETENTION_DAYS): they wait until ORCH_WEBHOOK_URL is set where the "
        "sweeper or outbox dispatcher runs."
    )
    expect(card.locator("tbody tr").first).to_contain_text("none yet, written")


def test_the_console_has_an_icon_and_asks_for_no_missing_one(
    browser: Any, console: Console
) -> None:
    """Before, each load asked for /favicon.ico, a 404 and an error in the browser's console."""
    context = browser.new_context()
    tab = context.new_page()
    missing: list[str] = []
    tab.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    try:
        for path in ("/console", f"/console?token={TOKEN}"):  # the sign-in page, then the console
            tab.goto(f"{console.url}{path}")
            icon = tab.locator("link[rel=icon]")
            expect(icon).to_have_count(1)
            # The icon draws: a data: image (the CSP's img-src allows it), not a request.
            drawn = tab.evaluate("""(href) => new Promise((done) => {
              const image = new Image();
              image.onload = () => done(image.naturalWidth > 0);
              image.onerror = () => done(false);
              image.src = href;
            })""", icon.get_attribute("href"))  # fmt: skip
            assert drawn
            assert icon.get_attribute("href").startswith("data:image/svg+xml,")
        expect(tab.locator("h1")).to_have_text("Tasks")
    finally:
        context.close()
    assert missing == []


#: The words of the generations' and evidence tables' cells (ids and hashes, in `code`, aside)
#: that the browser broke over two lines, and the times whose date and clock, or how long ago
#: they were, are not on one line.
BROKEN_WORDS = """() => {
  const broken = [];
  const lines = (range) => new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
  for (const td of document.querySelectorAll('#generations td, #evidence td')) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.parentElement.closest('code')) continue;
      for (const m of n.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(n, m.index);
        range.setEnd(n, m.index + m[0].length);
        if (lines(range) > 1) broken.push(m[0]);
      }
    }
    for (const stamp of td.querySelectorAll('time .stamp, time .far')) {
      const range = document.createRange();
      range.selectNodeContents(stamp);
      if (lines(range) > 1) broken.push(stamp.textContent);
    }
  }
  return broken;
}"""


def test_table_cells_on_a_desk_break_between_words(page: Any, console: Console) -> None:
    """At 1280 px a worker, a source or a date broke mid-word ('celery@v m:3305', 'scada_s im',
    a date at its comma) in the Generations and Evidence tables."""
    task_id = console.trigger("retried", "Words kept whole")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    open_task(page, console, task_id)
    expect(page.locator("#generations td").first).to_be_visible()
    expect(page.locator("#evidence td time")).to_have_count(1)
    assert page.evaluate(BROKEN_WORDS) == []
    assert page.evaluate(NO_OVERFLOW) == {"page": 0, "main": 0}
    # And no table is wider than its card, which hid its last column behind a sideways scroll:
    # at 1280 px the generations' Reason, the one that says why a round ended, showed two
    # letters a line.
    assert set(page.evaluate(SCROLLED)) == {0}
    reason = page.locator('#generations td[data-label="Reason"]').first
    # At least about 15 characters a line (its width moves with the worker's name and the times).
    assert reason.evaluate("(td) => td.getBoundingClientRect().width") >= 120
    shot(page, "tables-1280px")
    # Wider, the page keeps its width; narrower, whole words would push a table past its card.
    for width in (1920, 1024, 768, 700):
        page.set_viewport_size({"width": width, "height": 900})
        assert set(page.evaluate(SCROLLED)) == {0}, width
