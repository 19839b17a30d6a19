"""An operator settles an `unknown` or `pending` write receipt (`invocations resolve`).

The dishonest cases first: a resolution never turns a write a completed node cites into a failed
one, and never completes a task itself; the next round's decision (invariant 23) does, from
the receipts as they then are.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import create_app
from orchestrator.cli import main
from orchestrator.domain.times import wire_time
from orchestrator.errors import ConflictError, NotFound, ValidationFailed
from orchestrator.runtime import Runtime
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.invocations import InvocationService
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import task_events as event_store
from orchestrator.store.receipts import Receipt, ReceiptLedger
from tests.executions_support import (
    kept_node,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    write_script,
)
from tests.integration.fake_backend import Backend, api_call, gateway_overrides, running_backend
from tests.integration.receipt_rows import (
    DIGEST,
    chat_session,
    claim_arguments,
    running_task,
    supersede,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server
        server.release.set()


@pytest.fixture
def rt(store_url: str, scripts: Path, tmp_path: Path, backend: Backend) -> Iterator[Runtime]:
    overrides = gateway_overrides(tmp_path, backend, gateway_timeout_seconds=2.0, max_rounds=10)
    runtime, _ = runtime_for(store_url, scripts, **overrides)
    yield runtime
    runtime.close()


def service(rt: Runtime) -> InvocationService:
    return InvocationService(rt.db, rt.dispatcher)


def order(call_id: str = "o", quantity: int = 1) -> dict[str, Any]:
    return api_call(call_id, "createOrder", body={"item": "valve", "quantity": quantity})


def completing_after(work: list[dict[str, Any]], cite: list[str] | None = None) -> list[Any]:
    """Query, plan, do `work`, complete the node (citing `cite` too) and report `completed`."""
    cited = ["${q0.evidence_id}", *(cite or [])]
    return [
        {"tool_calls": [query_call(), plan_call("p1", "r1", [node("a", "running")])]},
        {"tool_calls": work},
        {"tool_calls": [plan_call("p2", "r2", [node("a", "completed", cite=cited)])]},
        {"tool_calls": [report_call("rep", "completed")]},
        {"content": "all done"},
    ]


def next_round(new_nodes: list[dict[str, Any]], work: list[Any] | None = None) -> list[Any]:
    """Generation 2: keep the previous plan's node, add `new_nodes`, do `work`, report done."""
    read = {"id": "c0", "name": "read_task_context", "arguments": {}}
    nodes = [kept_node(0), *new_nodes]
    edges = [{"from": "a", "to": n["id"]} for n in new_nodes]
    return [
        {"tool_calls": [read, query_call()]},
        {"tool_calls": [plan_call("p1", "g2", nodes, edges)]},
        *([{"tool_calls": work}] if work else []),
        {"tool_calls": [report_call("rep", "completed")]},
        {"content": "done"},
    ]


def run_first_round(rt: Runtime, scripts: Path, turns: list[Any]) -> str:
    write_script(scripts, "ordering", turns)
    task_id = rt.tasks.trigger(Trigger(task_type="ordering", title="t")).task.task_id
    rt.executions.run(task_id, 1, worker="w1")
    return task_id


def task_receipts(rt: Runtime, task_id: str) -> list[Receipt]:
    return list(ReceiptLedger(rt.db).list_for_owner(f"task:{task_id}"))


def resolutions(rt: Runtime, task_id: str) -> list[event_store.TaskEvent]:
    with rt.db.transaction(readonly=True) as conn:
        events = event_store.events_after(conn, task_id, 0, 100)
    return [e for e in events if e.type == "invocation_resolved"]


# -- the dishonest cases ---------------------------------------------------------------------


def test_a_succeeded_write_that_a_completed_node_cites_cannot_be_resolved_failed(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    task_id = run_first_round(rt, scripts, completing_after([order()], cite=["${o.invocation_id}"]))
    [write] = task_receipts(rt, task_id)
    assert write.status == "succeeded"
    assert rt.tasks.get(task_id).status == "completed"
    with pytest.raises(ConflictError) as refused:
        service(rt).resolve(write.invocation_id, "failed", by="otto", reason="it did not happen")
    assert refused.value.code == "not_resolvable"
    # Nothing changed: the completed node still rests on a succeeded write.
    [after] = task_receipts(rt, task_id)
    assert (after.status, after.summary, after.claim_token) == (
        "succeeded",
        write.summary,
        write.claim_token,
    )
    assert rt.tasks.get(task_id).status == "completed"
    assert resolutions(rt, task_id) == []


def test_resolving_the_only_open_write_failed_does_not_complete_the_waiting_task(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    backend.mode["/orders"] = "drop"  # applied, then the connection drops: unknown
    task_id = run_first_round(rt, scripts, completing_after([order()]))
    waiting = rt.tasks.get(task_id)
    assert waiting.status == "waiting"  # the report said completed, the write is unknown
    [write] = task_receipts(rt, task_id)
    assert write.status == "unknown"

    resolved = service(rt).resolve(write.invocation_id, "failed", by="otto", reason="not there")

    # Not completed by the resolution: the next round of the same intent round decides.
    assert resolved.previous_status == "unknown"
    assert resolved.receipt.status == "failed"
    assert resolved.task_status == "queued"
    assert resolved.queued_generation == 2
    task = rt.tasks.get(task_id)
    assert (task.status, task.generation, task.intent_round) == ("queued", 2, 1)
    assert rt.dispatcher.sent[-1] == (task_id, 2)  # type: ignore[attr-defined]
    [event] = resolutions(rt, task_id)
    assert event.data == {
        "invocation_id": write.invocation_id,
        "tool_name": "call_api",
        "previous_status": "unknown",
        "resolved_status": "failed",
        "by": "otto",
        "note": "not there",
    }
    assert event.reason is not None
    assert "otto" in event.reason
    assert "not there" in event.reason
    # A finisher or a verifier holding the old token cannot overwrite the operator's word.
    ledger = ReceiptLedger(rt.db)
    assert not ledger.resolve_verified(write.invocation_id, write.claim_token)
    assert not ledger.finish(write.invocation_id, write.claim_token, status="succeeded", summary="")

    # Generation 2 asks for the identical order: as any failed write of the round, it is not
    # sent again, and the receipt stays failed.
    backend.mode["/orders"] = "ok"
    rt.executions.run(task_id, 2, worker="w1")
    assert backend.count("POST", "/orders") == 1
    assert [r.status for r in task_receipts(rt, task_id)] == ["failed"]
    # An operator's requeue is a new intent round: the failed write may be sent again.
    requeued = rt.tasks.requeue(task_id, "try the order again")
    rt.executions.run(task_id, requeued.generation, worker="w1")
    assert backend.count("POST", "/orders") == 2
    assert sorted(r.status for r in task_receipts(rt, task_id)) == ["failed", "succeeded"]


def test_a_write_resolved_failed_cannot_back_a_completed_node_later(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    backend.mode["/orders"] = "drop"
    task_id = run_first_round(rt, scripts, completing_after([order()]))
    [write] = task_receipts(rt, task_id)
    service(rt).resolve(write.invocation_id, "failed", by="otto", reason="not there")
    # The next round completes a new node citing the failed write: refused, not completed.
    write_script(
        scripts, "ordering", next_round([node("b", "completed", cite=[write.invocation_id])])
    )
    rt.executions.run(task_id, 2, worker="w1")
    transcript = json.dumps(rt.tasks.transcript(task_id, 2))
    assert "write_not_succeeded" in transcript
    assert rt.tasks.get(task_id).status != "completed"


# -- what a resolution moves ------------------------------------------------------------------


def test_resolving_succeeded_answers_the_identical_write_from_the_receipt(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    backend.mode["/orders"] = "drop"
    task_id = run_first_round(rt, scripts, completing_after([order()]))
    [write] = task_receipts(rt, task_id)
    resolved = service(rt).resolve(
        write.invocation_id, "succeeded", by="otto", reason="the order is in the ERP"
    )
    assert resolved.receipt.status == "succeeded"
    assert "operator" in resolved.receipt.summary
    backend.mode["/orders"] = "ok"
    write_script(scripts, "ordering", next_round([], work=[order()]))
    rt.executions.run(task_id, 2, worker="w1")
    assert backend.count("POST", "/orders") == 1  # never sent again
    # The rule is applied again at the end of that round: nothing is open, so it completes.
    assert rt.tasks.get(task_id).status == "completed"


def test_a_pending_202_job_can_be_resolved(rt: Runtime, scripts: Path) -> None:
    task_id = run_first_round(
        rt, scripts, completing_after([api_call("j", "startJob", kind="flush")])
    )
    [job] = task_receipts(rt, task_id)
    assert job.status == "pending"
    assert rt.tasks.get(task_id).status == "waiting"
    resolved = service(rt).resolve(job.invocation_id, "succeeded", by="otto", reason="job done")
    assert (resolved.previous_status, resolved.receipt.status) == ("pending", "succeeded")
    assert rt.tasks.get(task_id).status == "queued"


def test_a_task_waiting_on_another_open_write_keeps_waiting(
    rt: Runtime, scripts: Path, backend: Backend
) -> None:
    backend.mode["/orders"] = "drop"
    task_id = run_first_round(rt, scripts, completing_after([order("o1", 1), order("o2", 2)]))
    first, second = task_receipts(rt, task_id)
    assert (first.status, second.status) == ("unknown", "unknown")
    one = service(rt).resolve(first.invocation_id, "succeeded", by="otto", reason="seen")
    assert one.task_status == "waiting"
    assert one.queued_generation is None
    assert rt.tasks.get(task_id).generation == 1
    two = service(rt).resolve(second.invocation_id, "failed", by="otto", reason="not seen")
    assert (two.task_status, two.queued_generation) == ("queued", 2)


def test_a_task_that_is_not_waiting_is_left_to_its_own_decision(rt: Runtime) -> None:
    task_id, invocation_id = unknown_task_write(rt)  # of generation 1; generation 2 runs
    resolved = service(rt).resolve(invocation_id, "failed", by="o", reason="r")
    assert (resolved.task_status, resolved.queued_generation) == ("running", None)
    assert rt.tasks.get(task_id).generation == 2


def test_a_write_of_the_round_still_running_is_left_to_that_round(rt: Runtime) -> None:
    """Its round settles it (a background command's end, a verification): a resolution now
    could not be corrected by what the round sees next."""
    task_id, session_id, fence = running_task(rt.db)
    ledger = ReceiptLedger(rt.db)
    claim = ledger.claim(**claim_arguments(session_id, owner=f"task:{task_id}"), fence=fence)
    ledger.finish(claim.receipt.invocation_id, claim.receipt.claim_token, status="pending",
                  summary="s")  # fmt: skip
    with pytest.raises(ConflictError) as refused:
        service(rt).resolve(claim.receipt.invocation_id, "succeeded", by="o", reason="r")
    assert refused.value.code == "round_running"
    assert ledger.get(claim.receipt.invocation_id).status == "pending"  # type: ignore[union-attr]
    assert resolutions(rt, task_id) == []
    supersede(rt.db, fence)  # the round ended (lost): the operator may settle it now
    resolved = service(rt).resolve(claim.receipt.invocation_id, "succeeded", by="o", reason="r")
    assert resolved.receipt.status == "succeeded"


# -- refusals ---------------------------------------------------------------------------------


def test_only_unknown_or_pending_task_writes_can_be_resolved(rt: Runtime) -> None:
    task_id, session_id, fence = running_task(rt.db)
    ledger = ReceiptLedger(rt.db)
    running = ledger.claim(**claim_arguments(session_id, owner=f"task:{task_id}"), fence=fence)
    with pytest.raises(ConflictError) as refused:
        service(rt).resolve(running.receipt.invocation_id, "succeeded", by="o", reason="r")
    assert refused.value.code == "not_resolvable"
    assert refused.value.details[0]["status"] == "running"
    with pytest.raises(NotFound):
        service(rt).resolve("no-such-invocation", "succeeded", by="o", reason="r")
    chat = ledger.claim(**claim_arguments(chat_session(rt.db)))
    with pytest.raises(ConflictError) as not_task:
        service(rt).resolve(chat.receipt.invocation_id, "failed", by="o", reason="r")
    assert not_task.value.code == "not_task_write"
    for status, reason in (("running", "r"), ("succeeded", " "), ("failed", "x" * 501)):
        with pytest.raises(ValidationFailed):
            service(rt).resolve(running.receipt.invocation_id, status, by="o", reason=reason)
    assert ledger.get(running.receipt.invocation_id).status == "running"  # type: ignore[union-attr]
    assert resolutions(rt, task_id) == []


def test_two_operators_racing_one_wins(rt: Runtime) -> None:
    task_id, session_id, fence = running_task(rt.db)
    ledger = ReceiptLedger(rt.db)
    claim = ledger.claim(
        **claim_arguments(session_id, owner=f"task:{task_id}", args_digest=DIGEST), fence=fence
    )
    ledger.finish(claim.receipt.invocation_id, claim.receipt.claim_token, status="unknown",
                  summary="s")  # fmt: skip
    supersede(rt.db, fence)  # its round ended; the next generation runs
    start = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def resolve(who: str, status: str) -> None:
        start.wait()
        try:
            service(rt).resolve(claim.receipt.invocation_id, status, by=who, reason="mine")
            outcomes[who] = "won"
        except ConflictError as exc:
            outcomes[who] = exc.code

    threads = [
        threading.Thread(target=resolve, args=("ana", "succeeded")),
        threading.Thread(target=resolve, args=("bo", "failed")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(outcomes.values()) == ["not_resolvable", "won"]
    [winner] = [who for who, outcome in outcomes.items() if outcome == "won"]
    [event] = resolutions(rt, task_id)
    assert event.data["by"] == winner
    expected = "succeeded" if winner == "ana" else "failed"
    assert ledger.get(claim.receipt.invocation_id).status == expected  # type: ignore[union-attr]


# -- the API and the CLI ----------------------------------------------------------------------

TOKENS = {"vera": ("viewer", "vera-secret-token"), "otto": ("operator", "otto-secret-token")}


def unknown_task_write(rt: Runtime) -> tuple[str, str]:
    """A task with one `unknown` write of generation 1, which was lost; generation 2 runs:
    (task_id, invocation_id)."""
    task_id, session_id, fence = running_task(rt.db)
    ledger = ReceiptLedger(rt.db)
    claim = ledger.claim(**claim_arguments(session_id, owner=f"task:{task_id}"), fence=fence)
    ledger.finish(claim.receipt.invocation_id, claim.receipt.claim_token, status="unknown",
                  summary="s")  # fmt: skip
    supersede(rt.db, fence)
    return task_id, claim.receipt.invocation_id


@pytest.fixture
def client(rt: Runtime, store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    accounts = tmp_path / "operators"
    accounts.write_text(
        "".join(
            f"{name} {role} {hashlib.sha256(token.encode()).hexdigest()}\n"
            for name, (role, token) in TOKENS.items()
        ),
        encoding="utf-8",
    )
    settings = load_settings(database_url=store_url, operators=accounts, api_token="shared-token")
    app = create_app(settings)
    app.state.invocations = InvocationService(rt.db, RecordingDispatcher())
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_api_resolves_for_operators_only(rt: Runtime, client: TestClient) -> None:
    task_id, invocation_id = unknown_task_write(rt)
    path = f"/api/v1/invocations/{invocation_id}/resolve"
    body = {"status": "failed", "reason": "no order in the ERP", "by": "not me"}

    viewer = client.post(path, json=body, headers=bearer(TOKENS["vera"][1]))
    assert (viewer.status_code, viewer.json()["error"]["code"]) == (403, "forbidden")
    assert client.post(path, json=body).status_code == 401
    for bad in ({**body, "status": "running"}, {**body, "reason": ""}, {"status": "failed"}):
        refused = client.post(path, json=bad, headers=bearer(TOKENS["otto"][1]))
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_request")
    # The shared token's account must say who acts.
    nameless = client.post(
        path, json={"status": "failed", "reason": "x"}, headers=bearer("shared-token")
    )
    assert (nameless.status_code, nameless.json()["error"]["code"]) == (422, "invalid_request")
    assert ReceiptLedger(rt.db).get(invocation_id).status == "unknown"  # type: ignore[union-attr]

    done = client.post(path, json=body, headers=bearer(TOKENS["otto"][1]))
    assert done.status_code == 200, done.text
    view = done.json()
    assert view["invocation_id"] == invocation_id
    assert (view["previous_status"], view["status"]) == ("unknown", "failed")
    assert view["resolved_by"] == "otto"  # the account's name, not the body's
    assert (view["task_id"], view["task_status"], view["queued_generation"]) == (
        task_id,
        "running",
        None,
    )
    assert "claim_token" not in view
    [event] = resolutions(rt, task_id)
    assert event.data["by"] == "otto"
    # The task's view lists the resolution (who, which write, from/to, why, when).
    task = client.get(f"/api/v1/tasks/{task_id}", headers=bearer(TOKENS["vera"][1])).json()
    assert task["unknown_receipts"] == []
    [shown] = task["resolutions"]
    assert shown == {
        "seq": event.seq,
        "at": wire_time(event.created_at),
        "generation": event.generation,
        "invocation_id": invocation_id,
        "tool_name": "call_api",
        "previous_status": "unknown",
        "resolved_status": "failed",
        "by": "otto",
        "note": "no order in the ERP",
    }

    again = client.post(path, json=body, headers=bearer(TOKENS["otto"][1]))
    assert (again.status_code, again.json()["error"]["code"]) == (409, "not_resolvable")
    missing = client.post(
        "/api/v1/invocations/nope/resolve", json=body, headers=bearer(TOKENS["otto"][1])
    )
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_the_cli_resolves(
    rt: Runtime,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task_id, invocation_id = unknown_task_write(rt)
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    resolve = ["invocations", "resolve", invocation_id]
    for usage in (["--as", "maybe", "--reason", "r"], ["--as", "failed"]):  # --reason required
        with pytest.raises(SystemExit) as exited:
            main([*resolve, *usage])
        assert exited.value.code == 2
    assert main([*resolve, "--as", "failed", "--reason", "  "]) == 2
    assert main(["invocations", "resolve", "nope", "--as", "failed", "--reason", "r"]) == 1
    assert ReceiptLedger(rt.db).get(invocation_id).status == "unknown"  # type: ignore[union-attr]
    capsys.readouterr()
    # `tasks show` names each open write and the command that settles it.
    assert main(["tasks", "show", task_id]) == 0
    shown = capsys.readouterr().out
    assert "invocations resolve ID" in shown
    assert f"    {invocation_id}  call_api  unknown  since " in shown

    assert main([*resolve, "--as", "succeeded", "--reason", "in the ERP", "--by", "ana"]) == 0
    out = capsys.readouterr().out
    assert f"invocation {invocation_id} (call_api) unknown -> succeeded by ana" in out
    assert f"task {task_id} is running" in out
    assert main([*resolve, "--as", "failed", "--reason", "no", "--json"]) == 1
    assert "not_resolvable" in capsys.readouterr().err
    assert ReceiptLedger(rt.db).get(invocation_id).status == "succeeded"  # type: ignore[union-attr]
    [event] = resolutions(rt, task_id)
    assert event.data["by"] == "ana"
    # No longer open, and `tasks show` says who settled it, how, why and when.
    assert main(["tasks", "show", task_id]) == 0
    shown = capsys.readouterr().out
    assert "unknown or pending" not in shown
    assert "write resolutions by operators: 1" in shown
    at = wire_time(event.created_at)
    assert (
        f"    {invocation_id}  call_api  unknown -> succeeded  by ana  at {at}  (generation "
        f"{event.generation}): in the ERP\n"
    ) in shown
    assert main(["tasks", "show", task_id, "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["resolutions"]
    assert (entry["invocation_id"], entry["by"], entry["note"]) == (
        invocation_id,
        "ana",
        "in the ERP",
    )
    assert (entry["previous_status"], entry["resolved_status"]) == ("unknown", "succeeded")
