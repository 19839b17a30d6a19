"""A task waiting on an approval and on a person's step says both: the generation's reason, the
`waiting` event (the task stream and the webhook) and the explain view name the action count and
the human nodes, so once the action is approved the task still says what it waits for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.cli.task_show import render_explain
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store.tables import outbox
from orchestrator.store.task_events import events_after
from tests.executions_support import (
    READ_AND_QUERY,
    approve_the_action,
    execution_end,
    node,
    plan_call,
    report_call,
    runtime_for,
    write_script,
)

SAMPLE = {
    "id": "sample",
    "title": "Sample tap 3",
    "actor": "human",
    "description": "a crew samples tap 3",
    "evidence": "",
    "status": "waiting",
    "reason": "a crew must sample",
}
PROPOSE = {
    "id": "c2",
    "name": "propose_action",
    "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "north"}},
}


def proposes_and_waits(tmp_path: Path, nodes: list[dict[str, Any]]) -> None:
    """The script `wo`: publish `nodes`, propose the repair's work order, report `waiting`."""
    write_script(
        tmp_path / "scripts",
        "wo",
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", nodes)]},
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts")
    yield runtime
    runtime.close()


def test_a_task_waiting_on_an_action_and_a_person_names_both(rt: Runtime, tmp_path: Path) -> None:
    proposes_and_waits(tmp_path, [node("check", "completed"), SAMPLE, node("repair", "waiting")])
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"

    said = "1 action(s) await approval; human node(s) not completed: sample"
    assert execution_end(rt, task_id, 1) == ("waiting", said)
    with rt.db.transaction(readonly=True) as conn:
        (waiting,) = [e for e in events_after(conn, task_id, 0, 50) if e.type == "waiting"]
    assert waiting.reason == said  # what the task stream and the webhook send

    # Approved, the task still waits for the crew, and its reason said so from the start.
    approve_the_action(rt, task_id)
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("waiting", 1)
    assert "human node(s) not completed: sample" in execution_end(rt, task_id, 1)[1]


RETEST = SAMPLE | {"id": "retest", "title": "Retest in the lab", "reason": "the lab retests"}


def waiting_events(rt: Runtime, task_id: str) -> list[tuple[str | None, bool]]:
    """The reasons of the task's `waiting` events, each with whether its webhook was written."""
    with rt.db.transaction(readonly=True) as conn:
        events = [e for e in events_after(conn, task_id, 0, 50) if e.type == "waiting"]
        hooked = set(
            conn.execute(
                select(outbox.c.event_seq).where(
                    outbox.c.task_id == task_id, outbox.c.kind == "webhook"
                )
            ).scalars()
        )
    return [(e.reason, e.seq in hooked) for e in events]


def test_a_decision_that_leaves_the_task_waiting_says_what_it_waits_on_now(
    rt: Runtime, tmp_path: Path
) -> None:
    """DESIGN invariant 24: a decision re-decides the task at once. One that leaves it waiting
    on something else sends a new `waiting` event (stream and webhook) with the new reason;
    before, a backend following them went on reading that the action awaited approval."""
    proposes_and_waits(
        tmp_path, [node("check", "completed"), SAMPLE, RETEST, node("repair", "waiting")]
    )
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    first = "1 action(s) await approval; human node(s) not completed: sample, retest"
    assert waiting_events(rt, task_id) == [(first, True)]

    approve_the_action(rt, task_id)
    rt.human_steps.close(task_id, "sample", "completed", by="crew", evidence="bottle 7")
    assert waiting_events(rt, task_id) == [
        (first, True),
        ("human node(s) not completed: sample, retest", True),
        ("human node(s) not completed: retest", True),
    ]
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation) == ("waiting", 1)
    # The operator's view says it too (the generation's reason says how its round ended).
    view = rt.tasks.explain(task_id)
    assert view["waiting_on"] == "human node(s) not completed: retest"
    assert "  waiting on: human node(s) not completed: retest\n" in render_explain(view)
