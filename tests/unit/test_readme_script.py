"""The example of a scripted model in docs/model.md is a script that runs: it loads as the
scripted model reads scripts, names only tools the agent has, and every plan it publishes passes
the plan's validation (a user copying it to try the scripted model saw its plan refused,
`empty_plan`)."""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.domain.plans import parse_plan
from tests.documents import ROOT

MODEL_DOC = ROOT / "docs" / "model.md"
TASK_TOOLS = {
    "read_task_context",
    "query_data_source",
    "publish_execution_plan",
    "propose_action",
    "save_report",
}


def _example() -> dict[str, Any]:
    section = MODEL_DOC.read_text(encoding="utf-8").split("\n## The scripted model\n", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.DOTALL)
    assert block is not None
    # `${CALL_ID.path}` takes an id the host makes up at run time: one stands in for it here.
    text = re.sub(r"\$\{[^}]+\}", "3f2a9c4e-0d1b-4c5a-9e7f-2b8d6a1c4e90", block.group(1))
    loaded = json.loads(text)
    assert isinstance(loaded, dict)
    return loaded


def test_the_scripted_model_example_publishes_a_valid_plan_and_reports() -> None:
    calls = [call for turn in _example()["turns"] for call in turn.get("tool_calls", [])]
    assert {call["name"] for call in calls} <= TASK_TOOLS
    plans = [call["arguments"] for call in calls if call["name"] == "publish_execution_plan"]
    assert plans
    for plan in plans:
        _, problems = parse_plan(plan)
        assert not problems, problems
    assert calls[-1]["name"] == "save_report"  # the report comes last
