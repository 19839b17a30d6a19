"""What an approver reads on an approval card before deciding: which task the action is for
(its title, not only its id) and which step of the plan it serves (the node's title, and why
the node waits, as the plan it was proposed under says), in a real headless chromium against a
real API, worker and sweeper with the scripted model."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_approval_card_names_its_task_and_the_step_it_serves(
    page: Any, console: Console
) -> None:
    """Two incidents propose the same work order: before, their cards were alike but for a
    task id ("work_order for node flush", the payload), and the approver could not tell which
    incident each would act on without opening every task."""
    first = console.trigger("approval", "Turbid water on Mill Lane")
    second = console.trigger("approval", "Low pressure on Quay Street")
    for task_id in (first, second):
        console.wait_for(task_id, lambda t: t["status"] == "waiting")
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator("#approvals > article.action").filter(has_text=first)
    expect(card.locator(".action-task")).to_have_text(f"Turbid water on Mill Lane ({first})")
    expect(card.locator(".action-node")).to_have_text(
        "step flush (flush), waiting: waits for the duty engineer's approval"
    )
    other = page.locator("#approvals > article.action").filter(has_text=second)
    expect(other.locator(".action-task")).to_have_text(f"Low pressure on Quay Street ({second})")
    shot(page, "approval-context")
    # The API says the same to any client.
    [action] = console.http.get("/api/v1/actions", params={"task_id": first}).json()["items"]
    assert action["task_title"] == "Turbid water on Mill Lane"
    assert action["node"] == {
        "title": "step flush",
        "status": "waiting",
        "reason": "waits for the duty engineer's approval",
        "description": None,
    }


def test_a_stale_approval_is_said_where_it_stays_and_its_card_leaves(
    page: Any, console: Console
) -> None:
    """The task was cancelled elsewhere while the approver read the card. Before, Approve said
    the refusal inside the card, which went on reading `pending_approval` with its buttons,
    and the next poll took the card away with the only word of what had happened."""
    task_id = console.trigger("approval", "Cancelled while the approver read it")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    [action] = console.http.get("/api/v1/actions", params={"task_id": task_id}).json()["items"]
    page.goto(f"{console.url}/console#/approvals")
    card = page.locator("#approvals > article.action").filter(has_text=task_id)
    card.locator("input[name=by]").fill("duty engineer")
    cancelled = console.http.post(f"/api/v1/tasks/{task_id}/cancel", json={"reason": "duplicate"})
    assert cancelled.status_code == 200, cancelled.text
    card.locator("button.approve").click()
    expect(page.locator("#approvals-result")).to_have_text(
        f"Not approved: work_order for node flush of task {task_id}: action "
        f"{action['action_id']} was superseded: the task was cancelled (stale_approval)"
    )
    expect(card).to_have_count(0)
