"""An approved work order the business backend keeps refusing (HTTP 500), as the approver
reads it under the task's decided actions, in a real headless chromium against a real API,
worker and sweeper whose dispatcher sends it to a loopback backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, running_console
from tests.browser.pages import open_task
from tests.outbox_support import running_recorder
from tests.services import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, browser: Any, redis_server: RedisServer
) -> Iterator[Console]:
    with running_recorder() as backend:
        backend.always_fail, backend.fail_status = True, 500
        with running_console(
            tmp_path_factory.mktemp("refused"),
            redis_server,
            ORCH_ACTIONS_URL=f"{backend.url}/actions",
            ORCH_ACTIONS_SECRET="refused-actions-secret-51d0",
            ORCH_OUTBOX_POLL_SECONDS="0.2",
            ORCH_OUTBOX_BACKOFF_SECONDS="0.2",
            ORCH_OUTBOX_BACKOFF_MAX_SECONDS="1",
        ) as server:
            yield server


def test_an_approved_work_order_the_backend_refuses_says_why_it_is_still_pending(
    page: Any, console: Console
) -> None:
    """Before, the decided action read "pending (3 attempt(s)) · outbox N": as if on its way,
    while the backend answered 500 to every attempt (the error was only further down, in the
    task's deliveries, among its events)."""
    task_id = console.trigger("approval", "Flush refused by the backend")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    [action] = console.http.get("/api/v1/actions", params={"task_id": task_id}).json()["items"]
    approved = console.http.post(
        f"/api/v1/actions/{action['action_id']}/approve",
        json={"by": "duty engineer", "digest": action["digest"]},
    )
    assert approved.status_code == 200, approved.text
    open_task(page, console, task_id)
    delivery = page.locator("#decided-actions .delivery")
    expect(delivery).to_contain_text("pending")
    expect(delivery.locator(".delivery-error")).to_have_text("last error: HTTP 500")
    expect(delivery.locator(".delivery-next")).to_contain_text("next attempt ")
