"""What the console's browser tests share: opening a task's page, a transcript entry as the
API sends it, a task's deliveries dead-lettered (or set as a dispatcher or an operator left
them, and more of them written), a delivery's row in a table, an answer of the API (or a
request to it) held in the page."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

from playwright.sync_api import expect

from tests.browser.conftest import Console


def open_task(page: Any, console: Console, task_id: str) -> None:
    page.goto(f"{console.url}/console#/task/{task_id}")
    expect(page.locator("#task-title")).to_be_visible()


#: Holds the `nth` answer (1: the first) to a request for `path` (its path and query; the
#: API's real answer, read in full) until `window.__release()`; it then resolves in microtasks
#: only, before any other task of the page runs (a navigation's `hashchange`, a poll's timer).
_HOLD = """
(path, nth) => {
  const real = window.fetch.bind(window);
  let seen = 0;
  window.fetch = (input, init) => {
    const url = new URL(String(input), location.href);
    if (url.pathname + url.search !== path || ++seen !== nth) return real(input, init);
    return real(input, init).then(async (response) => {
      const text = await response.text();
      await new Promise((resolve) => { window.__release = resolve; });
      // A 304 (an ETag'd poll of an unchanged list) has no body: given one, Response throws,
      // and the page read the held answer as the API not answering, not as the answer it was.
      const bodiless = [101, 103, 204, 205, 304].includes(response.status);
      const answer = new Response(bodiless ? null : text, {
        status: response.status,
        headers: response.headers,
      });
      answer.json = async () => JSON.parse(text);
      return answer;
    });
  };
}
"""


def hold_answer(page: Any, path: str, nth: int = 1) -> None:
    """From the next page load on, the API's `nth` answer to `path` waits in the page until
    `window.__release()` (`window.__release` is defined once it has come). The page is left for
    about:blank, so that the next `goto` loads the console afresh, with the hold."""
    page.goto("about:blank")
    page.add_init_script(f"({_HOLD})({json.dumps(path)}, {nth})")


#: Holds the first request for `path` in the page, unsent, until `window.__send()` (defined once
#: it is asked): a write on its way on a slow network, before the API has seen it.
_HOLD_REQUEST = """
(path) => {
  const real = window.fetch.bind(window);
  let seen = 0;
  window.fetch = (input, init) => {
    const url = new URL(String(input), location.href);
    if (url.pathname + url.search !== path || ++seen !== 1) return real(input, init);
    return new Promise((resolve) => { window.__send = resolve; }).then(() => real(input, init));
  };
}
"""


def hold_request(page: Any, path: str) -> None:
    """From the next page load on, the first request for `path` waits in the page, unsent,
    until `window.__send()`; as `hold_answer`, the page is left for about:blank first."""
    page.goto("about:blank")
    page.add_init_script(f"({_HOLD_REQUEST})({json.dumps(path)})")


def transcript_entry(seq: int, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A transcript entry in the API's shape (TranscriptEntryView)."""
    return {"seq": seq, "generation": 1, "turn": seq, "kind": kind, "call_id": None,
            "parent_call_id": None, "tool_name": None, "status": None, "usage": None,
            "body": body}  # fmt: skip


def dead_letter_deliveries(console: Console, task_id: str) -> list[int]:
    """The task's webhooks as the dispatcher leaves them after a backend failed every attempt
    (two of them throttled); their ids."""
    from sqlalchemy import select, update

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            ids = list(conn.execute(select(outbox.c.outbox_id).where(outbox.c.task_id == task_id)))
            conn.execute(
                update(outbox)
                .where(outbox.c.task_id == task_id)
                .values(status="dead", attempts=8, throttled=2, last_error="HTTP 503")
            )
    finally:
        db.dispose()
    return [int(row[0]) for row in ids]


def set_rows(console: Console, values: dict[int, dict[str, Any]]) -> None:
    """Each delivery of `values` (by outbox id) as the dispatcher or an operator left it."""
    from sqlalchemy import update

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            for outbox_id, columns in values.items():
                row = outbox.c.outbox_id == outbox_id
                conn.execute(update(outbox).where(row).values(**columns))
    finally:
        db.dispose()


def more_events(console: Console, task_id: str, count: int) -> None:
    """`count` more task events of the task in its outbox, after its own (copies of its last
    one's row), as a longer task would leave: a finished test task has written one."""
    from sqlalchemy import func, insert, select

    from orchestrator.store import Database
    from orchestrator.store.tables import outbox

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            last = conn.execute(
                select(outbox).where(outbox.c.task_id == task_id, outbox.c.kind == "webhook")
                .order_by(outbox.c.event_seq.desc()).limit(1)
            ).one()._asdict()  # fmt: skip
            top = conn.execute(select(func.max(outbox.c.event_seq))).scalar_one()
            del last["outbox_id"]
            for n in range(1, count + 1):
                conn.execute(insert(outbox).values(**{**last, "event_seq": top + n}))
    finally:
        db.dispose()


def delivery_row(page: Any, where: str, outbox_id: int) -> Any:
    """The row of delivery `outbox_id` in the table under `where`."""
    return page.locator(f"{where} tbody tr").filter(
        has=page.locator("td:first-child", has_text=re.compile(f"^{outbox_id}$"))
    )


def failing_alone(console: Console, task_id: str) -> int:
    """The task's first event as a dispatcher leaves it after two failed attempts, backing off
    for minutes (pending, not dead), and its later events delivered: its id."""
    from orchestrator.store.types import utcnow

    first, *rest = dead_letter_deliveries(console, task_id)
    now = utcnow()
    set_rows(console, {
        first: {"status": "pending", "attempts": 2, "throttled": 0, "last_error": "HTTP 503",
                "next_attempt_at": now + timedelta(minutes=10)},
        **{n: {"status": "delivered", "delivered_at": now, "last_error": None} for n in rest},
    })  # fmt: skip
    return first


def pause_clock(page: Any) -> None:
    """Stop the page's clock before it opens the console: its polls run only when the test
    fast-forwards it, never between a read the test mends and the click that reads again."""
    page.goto("about:blank")
    page.clock.install(time=time.time())
    page.clock.pause_at(time.time() + 1)
