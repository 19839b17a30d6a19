"""Helpers for execution tests: scripts written on the fly, runtimes over a real store."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert

from orchestrator.agent.host import ToolHost
from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.sweeper import SweepReport
from orchestrator.services.tasks import Trigger
from orchestrator.settings import Settings, load_settings
from orchestrator.store import executions as execution_store
from orchestrator.store import generation_claims as claim_store
from orchestrator.store.tables import executions, sessions, tasks
from orchestrator.store.task_events import events_after
from orchestrator.store.types import utcnow
from orchestrator.tools.base import ToolCall, ToolContext, ToolResult

__all__ = [
    "READ_AND_QUERY",
    "RecordingHost",
    "approve_the_action",
    "claim_as_worker",
    "execution_end",
    "fenced_ctx",
    "insert_running",
    "kept_node",
    "last_queued_reason",
    "node",
    "plan_call",
    "query_call",
    "report_call",
    "runtime_and_api",
    "runtime_for",
    "simple_task",
    "sweep_at_once",
    "wait_for",
    "write_script",
]


#: What a completed node and a completed report cite by default: the evidence record of the
#: `query_call()` the round made first (the scripted model resolves the reference).
CITED = "${q0.evidence_id}"


def query_call(call_id: str = "q0") -> dict[str, Any]:
    """A query of the bundled simulated SCADA source: its result carries an evidence_id."""
    return {
        "id": call_id,
        "name": "query_data_source",
        "arguments": {
            "source": "scada_sim",
            "parameters": {"point": "DM-RN-01", "measure": "turbidity"},
        },
    }


def node(
    node_id: str,
    status: str,
    *,
    actor: str = "agent",
    evidence: str = "",
    cite: list[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": node_id,
        "title": f"Step {node_id}",
        "actor": actor,
        "description": f"do {node_id}",
        "evidence": evidence or ("seen" if status == "completed" else ""),
        "status": status,
    }
    if status in ("failed", "waiting"):
        body["reason"] = "because"
    if status == "completed" and actor == "agent":
        body["evidence_ids"] = [CITED] if cite is None else cite
    return body


def kept_node(index: int, read_call: str = "c0") -> str:
    """Node `index` of the previous generation's plan exactly as `read_task_context` (call
    `read_call`) returned it: a new generation keeps every node, completed ones unchanged."""
    return f"${{{read_call}.result.previous_generation.plan.nodes.{index}}}"


def plan_call(
    call_id: str,
    request_id: str,
    nodes: list[dict[str, Any]] | list[Any],
    edges: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    if edges is None:
        edges = [{"from": a["id"], "to": b["id"]} for a, b in itertools.pairwise(nodes)]
    return {
        "id": call_id,
        "name": "publish_execution_plan",
        "arguments": {
            "request_id": request_id,
            "title": "Investigation",
            "reason": f"update {request_id}",
            "nodes": nodes,
            "edges": edges,
        },
    }


def report_call(call_id: str, outcome: str, cite: list[str] | None = None) -> dict[str, Any]:
    """A report; a completed one cites the round's `query_call()` unless `cite` is given."""
    arguments: dict[str, Any] = {
        "summary": f"round ended {outcome}",
        "findings": [],
        "outcome": outcome,
    }
    cited = ([CITED] if outcome == "completed" else []) if cite is None else cite
    if cited:
        arguments["evidence_ids"] = cited
    return {"id": call_id, "name": "save_report", "arguments": arguments}


def write_script(
    folder: Path, task_type: str, turns: list[dict[str, Any]], *, record_requests: bool = False
) -> None:
    """The script of `task_type`; with `record_requests`, every request the model is sent is
    kept beside it (`<task_type>.json.requests.jsonl`)."""
    folder.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"turns": turns}
    if record_requests:
        body["record_requests"] = True
    (folder / f"{task_type}.json").write_text(json.dumps(body), encoding="utf-8")


#: A turn that reads the task's context (call `c0`, which `kept_node` refers to) and queries
#: the simulated source (`q0`, which `CITED` refers to).
READ_AND_QUERY: dict[str, Any] = {
    "tool_calls": [{"id": "c0", "name": "read_task_context", "arguments": {}}, query_call()]
}


def approve_the_action(rt: Runtime, task_id: str) -> None:
    """Approve the task's one action, as the person `ana`, by its digest."""
    (action,) = rt.actions.list(task_id=task_id)
    rt.actions.decide(action.action_id, approve=True, by="ana", note=None, digest=action.digest)


def last_queued_reason(rt: Runtime, task_id: str) -> str:
    """The reason of the task's latest `queued` event (among its first 50 events)."""
    with rt.db.transaction(readonly=True) as conn:
        queued = [e for e in events_after(conn, task_id, 0, 50) if e.type == "queued"]
    return queued[-1].reason or ""


def execution_end(rt: Runtime, task_id: str, generation: int) -> tuple[str | None, str]:
    """How generation `generation` of the task ended: its outcome and reason."""
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    assert execution is not None
    return execution.outcome, execution.reason or ""


def completing_turns(delay_s: float = 0.0) -> list[dict[str, Any]]:
    """A round that reads, plans, works for `delay_s`, completes and reports."""
    return [
        {"tool_calls": [{"id": "c1", "name": "read_task_context", "arguments": {}}, query_call()]},
        {"tool_calls": [plan_call("c2", "r1", [node("a", "running"), node("b", "pending")])]},
        {
            "delay_s": delay_s,
            "tool_calls": [plan_call("c3", "r2", [node("a", "completed"), node("b", "completed")])],
        },
        {"tool_calls": [report_call("c4", "completed")]},
        {"content": "done"},
    ]


def simple_task(rt: Runtime, scripts: Path) -> str:
    """A task of type `simple`, whose scripted round completes (`completing_turns`), triggered:
    its id."""
    write_script(scripts, "simple", completing_turns())
    return rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id


def settings_for(store_url: str, scripts: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": store_url,
        "model": f"scripted:{scripts}",
        "lease_seconds": 3,
        "lease_renew_seconds": 1,
        "sweep_seconds": 1,
        "queued_stale_seconds": 2,
    }
    values.update(overrides)
    return load_settings(**values)


@contextmanager
def runtime_and_api(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, Any]]:
    """A runtime on the store and a test client of an API on the same settings (its lifespan
    run), both closed after."""
    from fastapi.testclient import TestClient

    from orchestrator.api.app import create_app

    rt, _ = runtime_for(store_url, scripts)
    try:
        with TestClient(create_app(settings_for(store_url, scripts))) as client:
            yield rt, client
    finally:
        rt.close()


def runtime_for(
    store_url: str, scripts: Path, **overrides: Any
) -> tuple[Runtime, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    return build_runtime(settings_for(store_url, scripts, **overrides), dispatcher=dispatcher), (
        dispatcher
    )


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def claim_as_worker(rt: Runtime, task_id: str, generation: int, worker: str, ttl: float) -> str:
    """Take the lease and claim `generation` as a worker would (and never renew): the token."""
    token = rt.leases.acquire(task_lease(task_id), worker, ttl)
    assert token is not None
    with rt.db.transaction() as conn:
        assert claim_store.claim_generation(
            conn,
            task_id,
            generation,
            lease_token=token,
            worker=worker,
            celery_task_id=None,
            lease_expires_at=utcnow() + timedelta(seconds=ttl),
        )
    return token


def fenced_ctx(fence: Fence, session_id: str) -> ToolContext:
    """The tool context of a claimed generation, as the execution service builds it."""
    return ToolContext(
        owner=f"task:{fence.task_id}",
        session_id=session_id,
        round_id=f"{fence.task_id}:{fence.generation}",
        task_id=fence.task_id,
        generation=fence.generation,
        fence=fence,
    )


def sweep_at_once(*runtimes: Runtime) -> list[SweepReport]:
    """Every runtime's sweeper sweeps at the same moment (a barrier), each on its own thread."""
    reports: list[SweepReport] = []
    barrier = threading.Barrier(len(runtimes))

    def sweep(runtime: Runtime) -> None:
        barrier.wait()
        reports.append(runtime.sweeper.sweep())

    threads = [threading.Thread(target=sweep, args=(r,)) for r in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return reports


def insert_running(
    conn: Connection,
    runs: list[tuple[str, str, str]],
    *,
    task_type: str,
    worker: str,
    lease_expires_at: datetime,
) -> None:
    """Running generation-1 executions inserted in bulk, one per (task id, session id, lease
    token): the task, session and started execution rows as a claim leaves them."""
    now = utcnow()
    conn.execute(
        insert(tasks),
        [
            {
                "task_id": task_id,
                "task_type": task_type,
                "title": "bulk",
                "context": {},
                "sample_input": None,
                "trigger_id": f"bulk:{task_id}",
                "origin": "live",
                "status": "running",
                "generation": 1,
                "session_id": session_id,
                "recoveries": 0,
                "rounds": 0,
                "queued_at": now,
                "created_at": now,
                "updated_at": now,
            }
            for task_id, session_id, _ in runs
        ],
    )
    conn.execute(
        insert(sessions),
        [
            {
                "session_id": session_id,
                "purpose": "task_execution",
                "task_id": task_id,
                "generation": 1,
                "owner": f"task:{task_id}",
                "title": "bulk (generation 1)",
                "created_at": now,
                "updated_at": now,
            }
            for task_id, session_id, _ in runs
        ],
    )
    conn.execute(
        insert(executions),
        [
            {
                "task_id": task_id,
                "generation": 1,
                "session_id": session_id,
                "worker": worker,
                "lease_token": token,
                "lease_expires_at": lease_expires_at,
                "created_at": now,
                "started_at": now,
            }
            for task_id, session_id, token in runs
        ],
    )


class RecordingHost(ToolHost):
    """The real host; it also keeps every (call, result) for the test to read."""

    seen: list[tuple[ToolCall, ToolResult]] = []

    def run_turn(self, ctx: ToolContext, calls: Any) -> list[ToolResult]:
        results = super().run_turn(ctx, calls)
        RecordingHost.seen.extend(zip(calls, results, strict=True))
        return results
