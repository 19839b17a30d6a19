"""The scripted model's scripts for the console's browser tests (`ORCH_MODEL=scripted:DIR`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["CONDITION", "HELD", "LONG_LABEL", "RLO", "XSS", "write_scripts"]

XSS = '<img src=x onerror="window.__xss=1">'
#: Logically "abc", a right-to-left override, then "dcba": drawn as is, it reads "abcabcd".
RLO = "abc\u202edcba"


def _node(node_id: str, status: str, **extra: Any) -> dict[str, Any]:
    node = {"id": node_id, "title": f"step {node_id}", "actor": "agent", "status": status}
    if status == "completed":
        node["evidence"] = f"evidence of {node_id}"
        node["evidence_ids"] = [_CITED]  # what the host recorded for the round's query
    return node | extra


def _plan(call_id: str, request_id: str, nodes: list[dict[str, Any]], **extra: Any) -> Any:
    arguments = {
        "request_id": request_id,
        "title": extra.pop("title", "Live plan"),
        "reason": extra.pop("reason", request_id),
        "nodes": nodes,
        "edges": extra.pop("edges", _EDGES),
    }
    return {"id": call_id, "name": "publish_execution_plan", "arguments": arguments}


def _turn(delay: float, *calls: Any) -> dict[str, Any]:
    return {"delay_s": delay, "tool_calls": list(calls)}


def _report(call_id: str, summary: str, outcome: str = "completed") -> Any:
    arguments: dict[str, Any] = {"summary": summary, "findings": [], "outcome": outcome}
    if outcome == "completed":
        arguments["evidence_ids"] = [_CITED]
    return {"id": call_id, "name": "save_report", "arguments": arguments}


#: The evidence record of the query every script makes first (the scripted model resolves it).
_CITED = "${q0.evidence_id}"
_QUERY = {
    "id": "q0",
    "name": "query_data_source",
    "arguments": {
        "source": "scada_sim",
        "parameters": {"point": "DM-RN-01", "measure": "turbidity"},
    },
}


#: A trunk a → d → e with a parallel branch a → b/c → d.
_EDGES = [
    {"from": "a", "to": "b"},
    {"from": "a", "to": "c", "label": "in parallel"},
    {"from": "b", "to": "d"},
    {"from": "c", "to": "d"},
    {"from": "d", "to": "e"},
]
_IDS = ["a", "b", "c", "d", "e"]


def _live() -> dict[str, Any]:
    first = [_node("a", "running")] + [_node(i, "pending") for i in _IDS[1:]]
    second = [_node("a", "completed"), _node("b", "running"), _node("c", "running")] + [
        _node(i, "pending") for i in _IDS[3:]
    ]
    done = [_node(i, "completed") for i in _IDS]
    return {
        "turns": [
            _turn(0.2, _plan("c1", "r1", first)),
            # Long enough apart that a page opened on a busy machine still sees each one.
            _turn(4.0, _plan("c2", "r2", second)),
            _turn(4.0, _plan("c3", "r3", done)),
            _turn(0.2, _report("c4", "all five steps done")),
            {"content": "done"},
        ]
    }


def _records() -> dict[str, Any]:
    """Its query comes a moment after the start (a page opened at once sees no evidence yet),
    then the plan is done and the report saved."""
    done = [_node(i, "completed") for i in _IDS]
    return {
        "turns": [
            _turn(0.2, _plan("c1", "r1", done)),
            _turn(0.2, _report("c2", "cited what it queried")),
            {"content": "done"},
        ]
    }


def _xss() -> dict[str, Any]:
    nodes = [_node("a", "completed", title=XSS, description=XSS)]
    report = _report("c2", XSS)
    report["arguments"]["findings"] = [
        {"text": XSS, "evidence_ids": [_CITED], "origin": "synthetic"}
    ]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title=XSS, reason=XSS, edges=[])),
            _turn(0.1, report),
            {"content": XSS},
        ]
    }


def _approval() -> dict[str, Any]:
    nodes = [_node("flush", "waiting", reason="waits for the duty engineer's approval")]
    propose = {
        "id": "c2",
        "name": "propose_action",
        "arguments": {
            "node_id": "flush",
            "kind": "work_order",
            "payload": {"what": "flush the hydrant on Mill Lane", "crew": "north"},
        },
    }
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Needs approval", edges=[])),
            _turn(0.1, propose),
            _turn(0.1, _report("c3", "a flush is proposed", "waiting")),
            {"content": "waiting for approval"},
        ]
    }


def _human() -> dict[str, Any]:
    nodes = [
        _node("prepare", "completed"),
        _node("inspect", "waiting", actor="human", reason="a crew must look at the valve"),
    ]
    edges = [{"from": "prepare", "to": "inspect"}]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Human step", edges=edges)),
            _turn(0.1, _report("c2", "waits for the crew", "waiting")),
            {"content": "waiting for a human"},
        ]
    }


def _steps() -> dict[str, Any]:
    """Two steps for people: a sample and a call-back (a test fails one, then closes the other
    while the next generation has no plan yet)."""
    nodes = [
        _node("prepare", "completed"),
        _node("sample", "waiting", actor="human", reason="a crew must sample the tap"),
        _node("callback", "pending", actor="human"),
    ]
    edges = [{"from": "prepare", "to": "sample"}, {"from": "prepare", "to": "callback"}]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Two steps", edges=edges)),
            _turn(0.1, _report("c2", "waits for the crew and the desk", "waiting")),
            {"content": "waiting for people"},
        ]
    }


def _succession() -> dict[str, Any]:
    """A sample and the retest planned after it from the start: when a person fails the sample,
    the retest is no retry of it (seed 004: a retry is a new node), though an edge joins them."""
    nodes = [
        _node("prepare", "completed"),
        _node("sample", "waiting", actor="human", reason="a crew must sample the tap"),
        _node("retest", "pending", actor="human"),
    ]
    edges = [{"from": "prepare", "to": "sample"}, {"from": "sample", "to": "retest"}]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Sample, then retest", edges=edges)),
            _turn(0.1, _report("c2", "waits for the crew", "waiting")),
            {"content": "waiting for people"},
        ]
    }


def _branches() -> dict[str, Any]:
    """Six parallel branches out of one step into one join (two of them for people): wider
    than a phone's screen, and than a desktop page at 14rem a node."""
    parallel = ["scada", "sample", "callback", "valve", "meter", "hydrant"]
    nodes = [_node("triage", "completed")] + [
        _node(i, "waiting", actor="human", reason=f"{i} waits for a crew")
        if i in ("sample", "callback")
        else _node(i, "completed")
        for i in parallel
    ]
    nodes.append(_node("close", "pending", actor="human"))
    edges = [{"from": "triage", "to": i, "label": f"if {i} is due"} for i in parallel]
    edges += [{"from": i, "to": "close", "label": f"{i} done"} for i in parallel]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Branches", edges=edges)),
            _turn(0.1, _report("c2", "waits for the crews", "waiting")),
            {"content": "waiting for people"},
        ]
    }


def _skips() -> dict[str, Any]:
    """A chain triage → sample → lab → close with edges that skip layers: triage → lab past
    sample, and triage → close past both."""
    nodes = [_node("triage", "completed"), _node("sample", "completed"),
             _node("lab", "completed"), _node("close", "pending", actor="human")]  # fmt: skip
    edges = [{"from": "triage", "to": "sample"}, {"from": "sample", "to": "lab"},
             {"from": "lab", "to": "close"}, {"from": "triage", "to": "lab", "label": "if clear"},
             {"from": "triage", "to": "close", "label": "if no leak"}]  # fmt: skip
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Skips", edges=edges)),
            _turn(0.1, _report("c2", "waits for the close", "waiting")),
            {"content": "waiting for people"},
        ]
    }


#: A condition longer than the gap between sibling nodes.
LONG_LABEL = "if the crew confirms that tap {} is due before noon today"


def _labels() -> dict[str, Any]:
    """Three branches whose conditions are each longer than a node is wide."""
    parallel = ["north", "south", "east"]
    nodes = [_node("triage", "completed")] + [_node(i, "completed") for i in parallel]
    edges = [{"from": "triage", "to": i, "label": LONG_LABEL.format(i)} for i in parallel]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Long labels", edges=edges)),
            _turn(0.1, _report("c2", "three branches done")),
            {"content": "done"},
        ]
    }


#: A condition longer than a node is wide, on an edge between two others with labels.
CONDITION = "if the crew confirms the hydrant on Elm Street can be flushed"


def _conditions() -> dict[str, Any]:
    """Conditions on the edges of a plan of three layers: out of one step to three (one of
    them CONDITION), from two of those into the last, and one past them all (drawn in a lane
    beside them)."""
    nodes = [_node("triage", "completed")] + [
        _node(i, "completed") for i in ("inspect", "sample", "notify", "close")
    ]
    edges = [
        {"from": "triage", "to": "inspect", "label": "if turbidity is over 4 NTU"},
        {"from": "triage", "to": "sample", "label": CONDITION},
        {"from": "triage", "to": "notify", "label": "if customers called"},
        {"from": "inspect", "to": "close", "label": "when the main is clear"},
        {"from": "sample", "to": "close", "label": "if the sample passes"},
        {"from": "notify", "to": "close"},
        {"from": "triage", "to": "close", "label": "if no leak is found"},
    ]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Conditions", edges=edges)),
            _turn(0.1, _report("c2", "the conditions were met")),
            {"content": "done"},
        ]
    }


#: A version of a script that holds its round (a later generation that has not published).
HELD: dict[str, Any] = {"turns": [{"delay_s": 120, "content": "never reached"}]}


def _retried() -> dict[str, Any]:
    """A step that failed and its completed retry (a new node with an edge from it)."""
    nodes = [
        _node("fetch", "failed", reason="the meter did not answer"),
        _node("fetch-2", "completed"),
    ]
    edges = [{"from": "fetch", "to": "fetch-2", "label": "retry"}]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Retried", edges=edges)),
            _turn(0.1, _report("c2", "fetched on the second try")),
            {"content": "done"},
        ]
    }


def _bidi() -> dict[str, Any]:
    """Bidirectional controls and zero-width characters in every kind of model text."""
    nodes = [
        _node("a", "completed", title=RLO, description="pay\u200bment to \u2067acct\u2069"),
        _node("b", "completed"),
    ]
    edges = [{"from": "a", "to": "b", "label": f"if {RLO}"}]
    report = _report("c2", RLO)
    report["arguments"]["findings"] = [
        {"text": f"finding {RLO}", "evidence_ids": [_CITED], "origin": "synthetic"}
    ]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title=f"Plan {RLO}", reason=RLO, edges=edges)),
            _turn(0.1, report),
            {"content": f"done\ufeff {RLO}"},
        ]
    }


def _slow() -> dict[str, Any]:
    nodes = [_node("a", "running")]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", nodes, title="Slow", edges=[])),
            {"delay_s": 120, "content": "never reached"},
        ]
    }


def _pinned() -> dict[str, Any]:
    """Two revisions, then a long wait. A later generation republishes neither (`a` is completed
    with this round's evidence, which a new round cannot cite), so it has no plan of its own."""
    first = [_node("a", "running"), _node("b", "pending")]
    second = [_node("a", "completed"), _node("b", "running")]
    return {
        "turns": [
            _turn(0.1, _plan("c1", "r1", first, title="Pinned", edges=[{"from": "a", "to": "b"}])),
            _turn(0.1, _plan("c2", "r2", second, title="Pinned", edges=[{"from": "a", "to": "b"}])),
            {"delay_s": 120, "content": "never reached"},
        ]
    }


def write_scripts(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {"live": _live(), "xss": _xss(), "approval": _approval(), "human": _human()}
    scripts["bidi"] = _bidi()
    scripts["slow"] = _slow()
    scripts["retried"] = _retried()
    scripts["pinned"] = _pinned()
    scripts["steps"] = _steps()
    scripts["succession"] = _succession()
    scripts["pager"] = _xss()  # a type of its own for the paging test
    scripts["records"] = _records()
    scripts["branches"] = _branches()
    scripts["skips"] = _skips()
    scripts["labels"] = _labels()
    scripts["conditions"] = _conditions()
    for name, script in scripts.items():
        # Every round queries the simulated SCADA source first: completed nodes and reports cite it.
        script["turns"].insert(0, _turn(3.0 if name == "records" else 0.0, _QUERY))
        (folder / f"{name}.json").write_text(json.dumps(script), encoding="utf-8")
    return folder
