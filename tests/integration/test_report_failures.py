"""Why a task the agent reported failed ended, where an operator reads it: the task's last error
(`GET /api/v1/tasks/{id}`, the task list, `orchestrator tasks show`), the generation's reason
and the `failed` event carry the report's own words, marked as the report's.

They read "the report declared the task failed" and nothing else: the operator learned that the
agent gave up, not why, and had to find the report's summary further down the page.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from tests.cli_in_process import run_main
from tests.executions_support import (
    READ_AND_QUERY,
    execution_end,
    node,
    plan_call,
    runtime_and_api,
    write_script,
)

#: What the agent found, as it said it in its report: long enough to be shortened.
SUMMARY = (
    "The turbidity at DM-RN-01 could not be traced: the SCADA point has reported a flat 0.00 "
    "NTU since the sensor swap on Monday, so no reading of the last 24 h can confirm or rule "
    "out the complaint. Ask the metering crew to check the new sensor's wiring, then requeue. "
    + "The rest is the detail of every reading looked at. "
    * 20
)
PREFIX = "the report declared the task failed: "


def failing_turns(summary: str) -> list[dict[str, Any]]:
    """A round that reads, fails its one step with a reason and reports the task failed."""
    failed = node("trace", "failed") | {"reason": "the SCADA point is flat since the swap"}
    report = {"summary": summary, "findings": [], "outcome": "failed"}
    return [
        READ_AND_QUERY,
        {"tool_calls": [plan_call("c2", "r1", [failed])]},
        {"tool_calls": [{"id": "c3", "name": "save_report", "arguments": report}]},
        {"content": "done"},
    ]


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, TestClient]]:
    with runtime_and_api(store_url, scripts) as both:
        yield both


def failed_task(rt: Runtime, scripts: Path, task_type: str, summary: str) -> str:
    write_script(scripts, task_type, failing_turns(summary))
    task_id = rt.tasks.trigger(Trigger(task_type=task_type, title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w:1").outcome == "failed"
    return task_id


def test_a_task_the_report_failed_says_why_in_the_report_s_words(
    env: tuple[Runtime, TestClient], scripts: Path, store_url: str, tmp_path: Path
) -> None:
    rt, client = env
    task_id = failed_task(rt, scripts, "trace", SUMMARY)
    view = client.get(f"/api/v1/tasks/{task_id}").json()
    assert (view["status"], view["failure_code"]) == ("failed", "report_failed")
    error = view["last_error"]
    # Said as the report's, in its words, shortened: the whole summary is in the report.
    assert error.startswith(PREFIX + "The turbidity at DM-RN-01 could not be traced")
    assert error.endswith("…")
    assert 200 < len(error) < 400, error
    shown = error[len(PREFIX) : -1]
    assert SUMMARY.startswith(shown)
    assert SUMMARY[len(shown)] in " ,.;:"  # cut between words, not in one
    assert view["report"]["summary"] == SUMMARY

    # The task list, the generation's end and `tasks show` say the same.
    listed = client.get("/api/v1/tasks", params={"status": "failed"}).json()["items"]
    assert [t["last_error"] for t in listed if t["task_id"] == task_id] == [error]
    assert execution_end(rt, task_id, 1) == ("failed", error)
    shown = run_main("tasks", "show", task_id, env={"ORCH_DATABASE_URL": store_url}, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"  last error: {error}\n" in shown.stdout


def test_a_short_summary_is_said_whole_on_one_line(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    rt, client = env
    task_id = failed_task(rt, scripts, "short", "No access to the valve chamber:\n  flooded.")
    error = client.get(f"/api/v1/tasks/{task_id}").json()["last_error"]
    assert error == PREFIX + "No access to the valve chamber: flooded."


def test_a_blank_summary_gives_the_failed_node_s_reason(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    rt, client = env
    task_id = failed_task(rt, scripts, "blank", "   ")
    error = client.get(f"/api/v1/tasks/{task_id}").json()["last_error"]
    assert error == (
        "the report declared the task failed; failed node trace: "
        "the SCADA point is flat since the swap"
    )
