"""A task waiting on an approval and on a person's step says both: the generation's reason, the
`waiting` event (the task stream and the webhook) and the explain view name the action count and
the human nodes, so once the action is approved the task still says what it waits for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
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


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts")
    yield runtime
    runtime.close()


def test_a_task_waiting_on_an_action_and_a_person_names_both(rt: Runtime, tmp_path: Path) -> None:
    write_script(
        tmp_path / "scripts",
        "wo",
        [
            READ_AND_QUERY,
            {
                "tool_calls": [
                    plan_call(
                        "c1", "r1", [node("check", "completed"), SAMPLE, node("repair", "waiting")]
                    )
                ]
            },
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
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
