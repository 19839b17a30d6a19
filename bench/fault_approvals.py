"""The human loop in the fault campaign: work orders proposed, decided by a person, delivered.

One task in `--approvals` of bench/faults.py proposes a work order and waits; a person (a thread
of the benchmark, through the same service the API and CLI call) approves it, or rejects one in
three, while the faults land; the approval commits its outbox row, and the sweeper's dispatcher
posts it to a loopback business backend that applies an action once per `Idempotency-Key`, as
DESIGN 24 asks a backend to. The campaign's `dispatcher` fault SIGKILLs the sweeper (its
dispatcher's thread with it) and starts another; the Redis and Postgres faults land on it too.
Every task event goes to the same backend as a signed webhook.

What it checks, once every task settled and the outbox drained (bounded):
- every approved action reached the backend with its action id as the key, and its outbox row
  says delivered; no rejected or superseded action reached it;
- every task event reached the backend, and each task's events were applied in `seq` order;
- what the backend received more than once (a dispatcher killed between its post and its
  record sends the row again with the same key: at least once on the wire, once applied).

The scripts: generation 1 reads, plans `check` (completed) and `flush` (waiting), proposes the
work order for `flush` and reports `waiting`. The person writes the task's next script before
deciding (the scripted model reads a changed script at the next round's start): it keeps
`check`, closes `flush` (completed with the approver's note, or failed with the rejection's) and
reports completed or failed. A generation the faults cut short starts its script again; what
the host refuses of a script run twice (a plan that drops the node's action id) is refused,
and the round goes on as a model's would; the next script closes `flush` citing what `check`
cites, so running it again publishes the same completed node.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_checks import OutboxRow, Post, delivery_findings

from tests.executions_support import kept_node, plan_call, query_call

__all__ = [
    "Approver",
    "approval_turns",
    "expected_status",
    "is_approval",
    "outbox_facts",
    "outbox_settled",
    "rejects",
    "wait_for_outbox",
]

#: The work order every approval task proposes (its own crew, so digests differ by task).
_NOTE = "approved by the duty engineer"
_REJECTION = "rejected: the crew is needed elsewhere"
_CITED = "${q0.evidence_id}"
#: What the kept `check` node cites: the same in every generation, so a generation that runs
#: the next script again publishes `flush` completed exactly as an earlier one did (a completed
#: node never changes, DESIGN 22), where citing its own query would be refused as a change.
_KEPT_EVIDENCE = "${c0.result.previous_generation.plan.nodes.0.evidence_ids.0}"
_READ = {"tool_calls": [{"id": "c0", "name": "read_task_context", "arguments": {}}, query_call()]}
_CHECK = {
    "id": "check",
    "title": "Check the turbidity",
    "actor": "agent",
    "description": "read DM-RN-01",
    "evidence": "turbidity read",
    "status": "completed",
    "evidence_ids": [_CITED],
}
_FLUSH = {
    "id": "flush",
    "title": "Flush the hydrant",
    "actor": "agent",
    "description": "flush the hydrant (a work order, needs approval)",
}

_EDGES = [{"from": "check", "to": "flush"}]


def is_approval(number: int, every: int) -> bool:
    """Whether task `number` is one of the campaign's approval tasks (one in `every`)."""
    return every > 0 and number % every == every - 1


def expected_status(task_type: str, every: int) -> str:
    """Where a campaign task should end: completed, or failed for a rejected work order."""
    if task_type.startswith("a") and rejects(int(task_type[1:]), every):
        return "failed"
    return "completed"


def rejects(number: int, every: int) -> bool:
    """Whether the person rejects task `number`'s work order (one approval task in three)."""
    return (number // every) % 3 == 2


def approval_turns(number: int) -> list[dict[str, Any]]:
    """Generation 1: read, plan, propose the work order for `flush`, report waiting."""
    waiting = _FLUSH | {"status": "waiting", "reason": "waits for the duty engineer"}
    propose = {
        "id": "a1",
        "name": "propose_action",
        "arguments": {
            "node_id": "flush",
            "kind": "work_order",
            "payload": {"hydrant": f"H-{number:04d}", "crew": "north"},
        },
    }
    report = {
        "id": "r1",
        "name": "save_report",
        "arguments": {"summary": "a flush is proposed", "findings": [], "outcome": "waiting"},
    }
    return [
        _READ,
        {"tool_calls": [plan_call("p1", "g1", [_CHECK, waiting], _EDGES)]},
        {"tool_calls": [propose]},
        {"tool_calls": [report]},
        {"content": "waiting for the approval"},
    ]


def _after_turns(action_id: str, approved: bool) -> list[dict[str, Any]]:
    """The next generation once the person decided: keeps `check`, closes `flush`, reports."""
    flush = _FLUSH | {"action_id": action_id}
    if approved:
        flush |= {"status": "completed", "evidence": _NOTE, "evidence_ids": [_KEPT_EVIDENCE]}
    else:
        flush |= {"status": "failed", "reason": _REJECTION}
    outcome = "completed" if approved else "failed"
    report: dict[str, Any] = {
        "summary": f"the flush was {'approved' if approved else 'rejected'}",
        "findings": [],
        "outcome": outcome,
    }
    if approved:
        report["evidence_ids"] = [_CITED]
    return [
        _READ,
        {"tool_calls": [plan_call("p2", "g2", [kept_node(0), flush], _EDGES)]},
        {"tool_calls": [{"id": "r2", "name": "save_report", "arguments": report}]},
        {"content": "done"},
    ]


def _write_atomically(path: Path, body: dict[str, Any]) -> None:
    """A round starting meanwhile reads the old script or the new one, never half of one."""
    spare = path.with_suffix(".json.tmp")
    spare.write_text(json.dumps(body), encoding="utf-8")
    os.replace(spare, path)


@dataclass
class Approver:
    """The person: decides each pending work order once it appears, while faults land."""

    rt: Any
    scripts: Path
    every: int
    number_of: dict[str, int]  # task id -> task number, as the triggers record them
    decided: dict[str, str] = field(default_factory=dict)  # action id -> approved/rejected
    refused: Counter[str] = field(default_factory=Counter)  # why a decision was refused
    retries: int = 0  # decisions tried again after an error (a server away)
    errors: list[str] = field(default_factory=list)  # what stopped the person (a bug here)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                pending = self.rt.actions.list(status="pending_approval", limit=200)
            except Exception:
                self.retries += 1
                continue
            for action in pending:
                if action.action_id not in self.decided:
                    try:
                        self._decide(action)
                    except Exception as exc:  # the benchmark's own mistake: said, not hidden
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                        self.stop.set()

    def _decide(self, action: Any) -> None:
        from orchestrator.errors import ConflictError

        number = self.number_of.get(action.task_id)
        if number is None:
            return  # its trigger's answer is not recorded yet: next time
        approve = not rejects(number, self.every)
        script = {"turns": _after_turns(action.action_id, approve)}
        _write_atomically(self.scripts / f"a{number:04d}.json", script)
        try:
            self.rt.actions.decide(
                action.action_id,
                approve=approve,
                by="duty engineer",
                note=_NOTE if approve else _REJECTION,
                digest=action.digest,
            )
        except ConflictError as refusal:  # superseded, decided already: the store's word stands
            self.refused[refusal.code] += 1
            self.decided[action.action_id] = "refused"
            return
        except Exception:
            self.retries += 1
            return
        self.decided[action.action_id] = "approved" if approve else "rejected"


def outbox_settled(query: Any) -> bool:
    """No outbox row is still pending (each delivered, dead or discarded)."""
    try:
        rows = query("SELECT count(*) FROM outbox WHERE status = 'pending'")
    except Exception:
        return False
    return bool(rows[0][0] == 0)


def wait_for_outbox(query: Any, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout and not outbox_settled(query):
        time.sleep(0.5)
    return time.monotonic() - started


def outbox_facts(query: Any, recorder: Any) -> dict[str, Any]:
    """What the store says was decided and delivered, against what the backend received
    (`fault_checks.delivery_findings` concludes)."""
    actions = query("SELECT action_id, status FROM actions")
    rows = query("SELECT outbox_id, kind, status, action_id FROM outbox ORDER BY outbox_id")
    with recorder.lock:
        received = list(recorder.received)
    posts = []
    for r in received:
        event = r.body if r.path == "/hooks" else {}
        posts.append(
            Post(
                r.path.lstrip("/"),
                r.headers.get("x-orchestrator-delivery"),
                r.headers.get("idempotency-key"),
                event.get("task_id"),
                event.get("seq"),
            )
        )
    return delivery_findings(
        [(a, status) for a, status in actions],
        [OutboxRow(str(i), kind, status, action) for i, kind, status, action in rows],
        posts,
    )
