"""Scripts of the human loop's browser tests: each task type has the script of its first
generation (it plans, proposes or waits for a person) and the script its next generation runs,
which a test writes over the first before the person decides (the scripted model reads a script
changed on disk again; a new generation starts from its first turn). The next generation reads
the task's context first and takes what people decided from it (`${c0.result...}`), as a model
would read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "FLUSH",
    "after_human_step",
    "after_the_decision",
    "proposes_a_flush",
    "waits_for_a_crew",
    "write_loop_script",
]

#: The work order the first generation proposes.
FLUSH = {"what": "flush the hydrant on Mill Lane", "crew": "north"}
_CITED = "${q0.evidence_id}"
#: Every round reads the task's context (people's decisions among it) and queries the source.
_READ = {
    "tool_calls": [
        {"id": "c0", "name": "read_task_context", "arguments": {}},
        {
            "id": "q0",
            "name": "query_data_source",
            "arguments": {
                "source": "scada_sim",
                "parameters": {"point": "DM-RN-01", "measure": "turbidity"},
            },
        },
    ]
}
_CHECK = {
    "id": "check",
    "title": "Check the turbidity",
    "actor": "agent",
    "description": "read DM-RN-01",
    "status": "completed",
    "evidence": "turbidity read at DM-RN-01",
    "evidence_ids": [_CITED],
}
#: The action's node as proposed: its title and description stay while the action binds them.
_FLUSH_NODE = {
    "id": "flush",
    "title": "Flush the hydrant",
    "actor": "agent",
    "description": "flush the hydrant on Mill Lane (work order, needs approval)",
}
_INSPECT = {
    "id": "inspect",
    "title": "Inspect the valve",
    "actor": "human",
    "description": "a crew looks at the valve on Mill Lane",
}
#: The previous generation's node `index` exactly as read_task_context gave it (kept unchanged).
_KEPT = "${{c0.result.previous_generation.plan.nodes.{}}}"
#: What the next generation read of the task's first action: the person's decision.
_DECIDED = "${{c0.result.actions.0.{}}}"


def _plan(request_id: str, nodes: list[Any], edges: list[dict[str, str]]) -> dict[str, Any]:
    arguments = {"request_id": request_id, "title": "Mill Lane turbidity",
                 "reason": request_id, "nodes": nodes, "edges": edges}  # fmt: skip
    return {"tool_calls": [{"id": "p1", "name": "publish_execution_plan", "arguments": arguments}]}


def _report(summary: str, outcome: str, findings: list[Any]) -> dict[str, Any]:
    arguments: dict[str, Any] = {"summary": summary, "findings": findings, "outcome": outcome}
    if outcome == "completed":
        arguments["evidence_ids"] = [_CITED]
    return {"tool_calls": [{"id": "r1", "name": "save_report", "arguments": arguments}]}


def proposes_a_flush() -> dict[str, Any]:
    """Generation 1: checks, plans the flush, proposes its work order and waits for it."""
    waiting = _FLUSH_NODE | {"status": "waiting", "reason": "waits for the duty engineer"}
    arguments = {"node_id": "flush", "kind": "work_order", "payload": FLUSH}
    propose = {"id": "a1", "name": "propose_action", "arguments": arguments}
    return {
        "turns": [
            _READ,
            _plan("g1", [_CHECK, waiting], [{"from": "check", "to": "flush"}]),
            {"tool_calls": [propose]},
            _report("a flush of Mill Lane is proposed", "waiting", []),
            {"content": "waiting for the approval"},
        ]
    }


def after_the_decision(approved: bool) -> dict[str, Any]:
    """Generation 2 after the decision it reads: the flush completed, its evidence the
    approver's note, and the task completed; or, rejected, the flush failed with the
    rejection's note as its reason and the task reported failed (DESIGN section 3: an action
    only a person approves; a step that cannot be done ends the task failed)."""
    flush = _FLUSH_NODE | {"action_id": _DECIDED.format("action_id")}
    if approved:
        flush |= {"status": "completed", "evidence": _DECIDED.format("note"),
                  "evidence_ids": [_CITED]}  # fmt: skip
        report = _report("Mill Lane flushed as approved", "completed",
                         [_DECIDED.format("decision"), _DECIDED.format("approver"),
                          _DECIDED.format("note")])  # fmt: skip
    else:
        flush |= {"status": "failed", "reason": _DECIDED.format("note")}
        report = _report("the flush was rejected", "failed",
                         [_DECIDED.format("decision"), _DECIDED.format("approver"),
                          _DECIDED.format("note")])  # fmt: skip
    return {
        "turns": [
            _READ,
            _plan("g2", [_KEPT.format(0), flush], [{"from": "check", "to": "flush"}]),
            report,
            {"content": "done"},
        ]
    }


def waits_for_a_crew() -> dict[str, Any]:
    """Generation 1: checks, plans a crew's inspection (a human node) and waits for it."""
    inspect = _INSPECT | {"status": "waiting", "reason": "a crew must look at the valve"}
    return {
        "turns": [
            _READ,
            _plan("g1", [_CHECK, inspect], [{"from": "check", "to": "inspect"}]),
            _report("waits for the crew's inspection", "waiting", []),
            {"content": "waiting for the crew"},
        ]
    }


def after_human_step() -> dict[str, Any]:
    """Generation 2 after the person closed the inspection: keeps both nodes as they are,
    closes the task with a node of its own whose evidence is what the person wrote."""
    person = "${c0.result.previous_generation.plan.nodes.1.evidence}"
    close = {"id": "close", "title": "Close the complaint", "actor": "agent",
             "description": "answer the customer", "status": "completed", "evidence": person,
             "evidence_ids": [_CITED]}  # fmt: skip
    edges = [{"from": "check", "to": "inspect"}, {"from": "inspect", "to": "close"}]
    closed_by = "${c0.result.previous_generation.plan.nodes.1.reason}"
    return {
        "turns": [
            _READ,
            _plan("g2", [_KEPT.format(0), _KEPT.format(1), close], edges),
            _report("the crew inspected the valve", "completed", [closed_by, person]),
            {"content": "done"},
        ]
    }


def write_loop_script(folder: Path, task_type: str, script: dict[str, Any]) -> None:
    """`script` as `folder/<task_type>.json`, over the one there (the next round reads it)."""
    (folder / f"{task_type}.json").write_text(json.dumps(script), encoding="utf-8")
