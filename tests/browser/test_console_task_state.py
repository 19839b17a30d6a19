"""What the task page says of a task's state the API reads from the store, in a real headless
chromium against a real API, worker and sweeper: a running round's lease Redis lost, shown from
the store's mirror and said so, not as a live lease; a queued task whose wake-up Redis refused,
said so, not as a plain "queued" that does not move, on its page, in the task list and in the
answer to a requeue.

Each state is written into the store as the worker or the trigger leaves it (Redis losing a lease
between two renewals a second apart cannot be timed from here) and put back after.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, shot
from tests.browser.pages import open_task
from tests.services import refused_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@contextmanager
def stored_as(
    console: Console, task_id: str, task: dict[str, Any], execution: dict[str, Any]
) -> Iterator[None]:
    """The task's row and its current generation's row with these columns while inside; put
    back as they were after."""
    from sqlalchemy import select, update

    from orchestrator.store import Database
    from orchestrator.store.tables import executions, tasks

    db = Database.from_url(console.env["ORCH_DATABASE_URL"])
    try:
        with db.transaction() as conn:
            was = conn.execute(select(tasks).where(tasks.c.task_id == task_id)).one()._asdict()
            current = (executions.c.task_id == task_id) & (
                executions.c.generation == was["generation"]
            )
            ran = conn.execute(select(executions).where(current)).one()._asdict()
            conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(**task))
            if execution:
                conn.execute(update(executions).where(current).values(**execution))
        try:
            yield
        finally:
            with db.transaction() as conn:
                conn.execute(
                    update(tasks)
                    .where(tasks.c.task_id == task_id)
                    .values(**{k: was[k] for k in task})
                )
                if execution:
                    put_back = {k: ran[k] for k in execution}
                    conn.execute(update(executions).where(current).values(**put_back))
    finally:
        db.dispose()


def test_a_lease_redis_lost_is_shown_as_the_store_s_copy(page: Any, console: Console) -> None:
    """After Redis lost a running round's lease, the API's view shows the store's mirror
    (`source: "store"`): the page says it is the store's copy, not confirmed by Redis; before,
    it drew it as the live lease."""
    task_id = console.trigger("xss", "A round whose lease Redis lost")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    expires = datetime.now(UTC) + timedelta(minutes=10)  # not expired: the sweeper leaves it
    running = {"outcome": None, "ended_at": None, "worker": "worker-7@ops-2",
               "worker_host": "ops-2", "worker_pid": None, "lease_expires_at": expires}  # fmt: skip
    with stored_as(console, task_id, {"status": "running"}, running):
        assert console.task(task_id)["lease"]["source"] == "store"
        open_task(page, console, task_id)
        card = page.locator("#lease")
        expect(card.locator("#lease-from-store")).to_contain_text(
            "The store's copy, not confirmed by Redis"
        )
        expect(card).to_contain_text("worker-7@ops-2")
        shot(page, "lease-from-store")


def test_a_queued_task_whose_wake_up_redis_refused_says_so(page: Any, console: Console) -> None:
    """A queued task whose wake-up the broker refused (`wake_up_unsent`): the page says the
    wake-up was not sent and that the sweeper sends it, not a plain "queued". The sweeper is
    stopped meanwhile: it would send the wake-up at its next sweep, a second away."""
    task_id = console.trigger("xss", "Queued while Redis refused")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    assert console.sweeper is not None
    console.sweeper.send_signal(signal.SIGSTOP)
    try:
        with stored_as(console, task_id, {"status": "queued", "queued_at": None}, {}):
            assert console.task(task_id)["wake_up_unsent"] is True
            open_task(page, console, task_id)
            expect(page.locator("#wake-up-unsent")).to_have_text(
                " wake-up not sent (Redis refused it); "
                "the sweeper sends it once Redis takes messages again"
            )
            shot(page, "wake-up-unsent")
    finally:
        console.sweeper.send_signal(signal.SIGCONT)


def test_the_task_list_says_a_queued_task_s_wake_up_was_not_sent(
    page: Any, console: Console
) -> None:
    """The list's row of a queued task whose wake-up the broker refused says so, as the task's
    page does: it read a plain "queued", the same as a task a worker is about to take. Once
    the wake-up is sent (the sweeper's claim sets `queued_at`) the row says it no more. The
    sweeper is stopped meanwhile, as above."""
    task_id = console.trigger("xss", "Listed while Redis refused")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    assert console.sweeper is not None
    console.sweeper.send_signal(signal.SIGSTOP)
    try:
        with stored_as(console, task_id, {"status": "queued", "queued_at": None}, {}):
            page.goto(f"{console.url}/console#/?status=queued")
            row = page.locator("tbody tr").filter(has_text="Listed while Redis refused")
            expect(row.locator(".wake-up-unsent")).to_have_text(
                " wake-up not sent (Redis refused it)"
            )
            shot(page, "list-wake-up-unsent")
            with stored_as(console, task_id, {"queued_at": datetime.now(UTC)}, {}):
                page.reload()  # read now, not at the list's next poll, 6 s away
                expect(row).to_contain_text("queued")
                expect(row.locator(".wake-up-unsent")).to_have_count(0)
    finally:
        console.sweeper.send_signal(signal.SIGCONT)


def test_a_requeue_whose_wake_up_redis_refused_says_so(page: Any, console: Console) -> None:
    """The API answers a requeue the broker did not take with `dispatched: false` (committed all
    the same, no worker woken): the page says the wake-up was not sent, not a plain "done.".
    The page is served by a second API on the same store whose Redis refuses connections (a
    port nothing listens on); the session cookie, the host's, signs it in there too."""
    task_id = console.trigger("xss", "Requeued while Redis refused")
    refusing = Console({**console.env, "ORCH_REDIS_URL": f"redis://127.0.0.1:{refused_port()}/0"},
                       console.folder)  # fmt: skip
    try:
        refusing.start_api()  # meanwhile the task's round runs
        console.wait_for(task_id, lambda t: t["status"] == "completed")
        page.goto(f"{refusing.url}/console#/task/{task_id}")
        page.fill("#requeue-reason", "look again")
        page.click("#requeue-form button")
        expect(page.locator("#op-result")).to_have_text(
            "Requeue: done; its wake-up was not sent (Redis refused it): "
            "the sweeper sends it once Redis takes messages again."
        )
        assert console.task(task_id)["generation"] >= 2  # committed all the same
    finally:
        if refusing.process is not None:  # nothing to drain: a kill is quicker than a stop
            refusing.process.kill()
            refusing.process.wait(timeout=10)
        refusing.http.close()
