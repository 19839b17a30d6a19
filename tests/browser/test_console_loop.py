"""The human loop end to end as an operator sees it in a real headless chromium: the agent
proposes a work order (or plans a crew's step), the operator decides (or closes the step) on
the task's page, the dispatcher delivers the approved work order to a business backend on
loopback, and the next generation reads the decision and ends the task, each step shown on
the page. A real API, worker and sweeper (with its dispatcher), the scripted model.

Each task type's next generation runs another script (loop_scripts.py), written before the
person decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATORS, Console, running_console, shot
from tests.browser.loop_scripts import (
    FLUSH,
    after_human_step,
    after_the_decision,
    proposes_a_flush,
    waits_for_a_crew,
    write_loop_script,
)
from tests.browser.pages import open_task
from tests.outbox_support import Recorder, running_recorder
from tests.services import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ACTIONS_SECRET = "loop-actions-secret-0b7e"
WEBHOOK_SECRET = "loop-webhook-secret-4c19"


@pytest.fixture(scope="module")
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory,
    browser: Any,
    redis_server: RedisServer,
    backend: Recorder,
) -> Iterator[Console]:
    with running_console(
        tmp_path_factory.mktemp("loop"),
        redis_server,
        ORCH_ACTIONS_URL=f"{backend.url}/actions",
        ORCH_ACTIONS_SECRET=ACTIONS_SECRET,
        ORCH_WEBHOOK_URL=f"{backend.url}/hooks",
        ORCH_WEBHOOK_SECRET=WEBHOOK_SECRET,
        ORCH_OUTBOX_POLL_SECONDS="0.2",
    ) as server:
        yield server


def scripts_of(console: Console) -> Path:
    return Path(console.env["ORCH_MODEL"].split(":", 1)[1])


@contextmanager
def signed_in(browser: Any, console: Console, name: str) -> Iterator[Any]:
    """A page signed in as the account `name` (its decisions and steps carry its name)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(f"{console.url}/console?token={OPERATORS[name][1]}")
    expect(tab.locator("#whoami-name")).to_have_text(name)
    yield tab
    context.close()
    assert not errors, errors


@pytest.fixture
def alma(browser: Any, console: Console) -> Iterator[Any]:
    """The approver."""
    with signed_in(browser, console, "alma") as tab:
        yield tab


@pytest.fixture
def otto(browser: Any, console: Console) -> Iterator[Any]:
    """An operator: closes human steps, decides no action."""
    with signed_in(browser, console, "otto") as tab:
        yield tab


def node(page: Any, node_id: str) -> Any:
    return page.locator(f'button.node[data-node="{node_id}"]')


def test_an_approved_work_order_is_delivered_and_the_task_completes(
    alma: Any, console: Console, backend: Recorder
) -> None:
    scripts = scripts_of(console)
    write_loop_script(scripts, "loop_approve", proposes_a_flush())
    task_id = console.trigger("loop_approve", "Turbid water on Mill Lane")
    open_task(alma, console, task_id)
    # The first generation plans the flush and waits for its approval: the page says so.
    expect(alma.locator("#task-head .badge").first).to_have_text("waiting")
    expect(alma.locator("#waiting-on")).to_contain_text("1 action(s) await approval")
    expect(node(alma, "flush").locator(".badge")).to_have_text("waiting")
    card = alma.locator("#pending-actions article.action")
    expect(card).to_contain_text(FLUSH["what"])
    expect(card.locator(".digest")).to_be_visible()
    assert backend.on("/actions") == []  # nothing is delivered before a person approves
    shot(alma, "loop-approval-waiting")

    write_loop_script(scripts, "loop_approve", after_the_decision(approved=True))
    card.locator("input[name=note]").fill("go ahead, crew north is on Mill Lane at 10")
    card.locator("button.approve").click()
    expect(alma.locator("#pending-result")).to_contain_text(
        f"Approved: work_order for node flush of task {task_id}."
    )
    # The next generation reads the decision, completes the flush citing it, and the task.
    expect(alma.locator("#task-head .badge").first).to_have_text("completed")
    expect(node(alma, "flush").locator(".badge")).to_have_text("completed")
    node(alma, "flush").click()
    detail = alma.locator("#node-detail")
    expect(detail).to_contain_text("go ahead, crew north is on Mill Lane at 10")
    action_id = detail.locator("dd code").last.inner_text()
    report = alma.locator("#report")
    expect(report).to_contain_text("Mill Lane flushed as approved")
    for finding in ("approved", "alma", "go ahead, crew north is on Mill Lane at 10"):
        expect(report.locator("ul.findings li").filter(has_text=finding).first).to_be_visible()
    expect(alma.locator("#generations tbody tr")).to_have_count(2)
    # The approved work order reached the backend once, and the page says it was delivered,
    # who approved it and with what note.
    expect(alma.locator("#deliveries dl.facts dd").first).to_have_text("delivered 1")
    decided = alma.locator(f'#decided-actions [data-action="{action_id}"]')
    expect(decided.locator(".badge").first).to_have_text("approved")
    expect(decided).to_contain_text("alma")
    expect(decided).to_contain_text("go ahead, crew north is on Mill Lane at 10")
    expect(decided).to_contain_text("delivered")
    [sent] = backend.on("/actions")
    assert sent.headers["idempotency-key"] == action_id
    assert (sent.body["payload"], sent.body["approver"]) == (FLUSH, "alma")
    # The plan shown is the final revision: generation 2's, every node done.
    expect(alma.locator("#status-counts")).to_contain_text("completed 2")
    expect(alma.locator("#plan-earlier")).to_have_count(0)
    shot(alma, "loop-approval-completed")


def test_a_rejected_work_order_is_never_delivered_and_the_task_fails_with_the_reason(
    alma: Any, console: Console, backend: Recorder
) -> None:
    scripts = scripts_of(console)
    write_loop_script(scripts, "loop_reject", proposes_a_flush())
    task_id = console.trigger("loop_reject", "Turbid water on Mill Lane, again")
    open_task(alma, console, task_id)
    expect(alma.locator("#task-head .badge").first).to_have_text("waiting")
    expect(alma.locator("#decided-actions")).to_have_text("No action of this task was decided yet.")
    card = alma.locator("#pending-actions article.action")
    expect(card).to_contain_text(FLUSH["what"])
    action_id = card.get_attribute("data-action")

    write_loop_script(scripts, "loop_reject", after_the_decision(approved=False))
    why = "the hydrant is under repair this week: no flush"
    card.locator("input[name=note]").fill(why)
    card.locator("button.reject").click()
    expect(alma.locator("#pending-result")).to_contain_text(
        f"Rejected: work_order for node flush of task {task_id}."
    )
    decided = alma.locator(f'#decided-actions [data-action="{action_id}"]')
    expect(decided.locator(".badge").first).to_have_text("rejected")
    expect(decided).to_contain_text("alma")
    expect(decided).to_contain_text(why)
    # The next generation reads the rejection: the flush cannot be done, so it fails the step
    # with the rejection's reason and reports the task failed, which ends it.
    expect(alma.locator("#task-head .badge").first).to_have_text("failed")
    expect(node(alma, "flush").locator(".badge")).to_have_text("failed")
    node(alma, "flush").click()
    expect(alma.locator("#node-detail")).to_contain_text(why)
    # The task ended: no retry is awaited, so none is asked for.
    retried = alma.locator("#node-detail dt", has_text="Retried by").locator(
        "xpath=following-sibling::dd[1]"
    )
    expect(retried).to_have_text("none")
    report = alma.locator("#report")
    expect(report).to_contain_text("the flush was rejected")
    for finding in ("rejected", "alma", why):
        expect(report.locator("ul.findings li").filter(has_text=finding).first).to_be_visible()
    latest = alma.locator("#generations tbody tr").first
    expect(latest.locator(".badge")).to_have_text("failed")
    expect(decided).not_to_contain_text("delivered")
    expect(alma.locator("#deliveries dl.facts dd").first).to_have_text("none")
    shot(alma, "loop-rejection-failed")
    assert [r for r in backend.on("/actions") if r.body["action_id"] == action_id] == []


def test_a_human_step_closed_in_the_console_lets_the_next_generation_complete_the_task(
    otto: Any, console: Console, backend: Recorder
) -> None:
    scripts = scripts_of(console)
    write_loop_script(scripts, "loop_human", waits_for_a_crew())
    task_id = console.trigger("loop_human", "A valve on Mill Lane hums")
    open_task(otto, console, task_id)
    expect(otto.locator("#task-head .badge").first).to_have_text("waiting")
    expect(otto.locator("#waiting-on")).to_contain_text("human node(s) not completed: inspect")
    inspect = node(otto, "inspect")
    expect(inspect.locator(".badge").first).to_have_text("waiting")
    inspect.click()
    detail = otto.locator("#node-detail")
    expect(detail.locator("#human-node")).to_be_visible()
    expect(detail.locator(".acting-as")).to_have_text("Acting as otto")  # no name to type
    # Completing a step needs evidence: the form says so and sends nothing without it.
    otto.click("#node-complete")
    expect(detail.locator(".node-result")).to_have_text("Evidence is needed to complete.")
    assert console.task(task_id)["generation"] == 1
    shot(otto, "loop-human-waiting")

    write_loop_script(scripts, "loop_human", after_human_step())
    seen = "valve 7 reseated, no leak; photo 114 in the crew log"
    otto.fill("#node-evidence", seen)
    otto.click("#node-complete")
    expect(detail.locator(".node-result")).to_contain_text("completed")
    # The step closed, the next generation reads it, closes the complaint citing what the
    # person wrote, and the task is completed.
    expect(otto.locator("#task-head .badge").first).to_have_text("completed")
    expect(node(otto, "close").locator(".badge")).to_have_text("completed")
    expect(inspect.locator(".badge").first).to_have_text("completed")
    inspect.click()
    expect(detail).to_contain_text(seen)
    reason = detail.locator("dt", has_text="Reason").locator("xpath=following-sibling::dd[1]")
    expect(reason).to_contain_text("otto")
    expect(detail.locator("#human-node")).to_have_count(0)  # closed: no form any more
    node(otto, "close").click()
    expect(detail).to_contain_text(seen)
    report = otto.locator("#report")
    expect(report).to_contain_text("the crew inspected the valve")
    expect(report.locator("ul.findings li").filter(has_text="otto")).to_have_count(1)
    expect(otto.locator("#status-counts")).to_contain_text("completed 3")
    expect(otto.locator("#plan-earlier")).to_have_count(0)
    expect(otto.locator("#generations tbody tr")).to_have_count(2)
    expect(otto.locator("#decided-actions")).to_have_text("No action of this task was decided yet.")
    shot(otto, "loop-human-completed")
