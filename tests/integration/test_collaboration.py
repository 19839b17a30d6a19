"""Collaboration sessions: questions and answers stored apart, answers made from the task's
authorised plan, report and evidence only, never from the execution transcript."""

from __future__ import annotations

import base64
import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, insert, update

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.domain.recovery import CallRecord, Snapshot
from orchestrator.errors import ConflictError
from orchestrator.runtime import Runtime
from orchestrator.services.collaboration import MAX_LIMIT, Answer, CollaborationService, snapshots
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import reports as report_store
from orchestrator.store.collaboration import insert_message
from orchestrator.store.snapshots import save_snapshot
from orchestrator.store.tables import evidence, reports
from orchestrator.store.types import utcnow
from tests.executions_support import CITED, node, plan_call, query_call, runtime_for
from tests.integration.test_operator_accounts import TOKENS, bearer, operators_file
from tests.openai_server import OpenAIServer, call

SECRETS = ("REASONING-SECRET-42", "call-SECRET-ID", "FINAL-TRANSCRIPT-TEXT")


def execution_turns() -> list[dict[str, Any]]:
    report = {
        "id": "call-SECRET-ID",
        "name": "save_report",
        "arguments": {
            "summary": "REPORT-SUMMARY-9 turbidity above limit",
            "findings": ["zone 4"],
            "evidence_ids": [CITED],
            "outcome": "completed",
        },
    }
    return [
        {
            "content": "REASONING-SECRET-42: I think the valve is stuck",
            "tool_calls": [query_call()],
        },
        {"tool_calls": [plan_call("c1", "r1", [node("check", "completed")])]},
        {"tool_calls": [report]},
        {"content": "FINAL-TRANSCRIPT-TEXT"},
    ]


def collaboration_turns(tool: str = "read_task_context") -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"id": "q1", "name": tool, "arguments": {}}]},
        {"content": "Turbidity was 4.1 NTU in zone 4, so the check is done."},
    ]


def write(scripts: Path, name: str, turns: list[dict[str, Any]]) -> None:
    scripts.mkdir(parents=True, exist_ok=True)
    body = {"turns": turns, "record_requests": True}
    (scripts / f"{name}.json").write_text(json.dumps(body), encoding="utf-8")


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, Path, str]]:
    scripts = tmp_path / "scripts"
    rt, _ = runtime_for(store_url, scripts)
    write(scripts, "col", execution_turns())
    write(scripts, "col.collaboration", collaboration_turns())
    task_id = rt.tasks.trigger(Trigger(task_type="col", title="Turbid water")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "completed"
    yield rt, scripts, task_id
    rt.close()


@pytest.fixture
def client(env: tuple[Runtime, Path, str], store_url: str) -> Iterator[TestClient]:
    _, scripts, _ = env
    app = create_app(load_settings(database_url=store_url, model=f"scripted:{scripts}"))
    with TestClient(app) as test_client:
        yield test_client


def test_an_answer_is_made_from_plan_report_and_evidence_and_never_the_transcript(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, scripts, task_id = env
    opened = client.post(f"/api/v1/tasks/{task_id}/collaboration")
    assert opened.status_code == 201
    session_id = opened.json()["session_id"]
    assert opened.json()["purpose"] == "task_collaboration"
    again = client.post(f"/api/v1/tasks/{task_id}/collaboration")
    assert (again.status_code, again.json()["session_id"]) == (200, session_id)

    asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Why done?"})
    assert asked.status_code == 201, asked.text
    body = asked.json()
    assert (body["question"]["role"], body["question"]["text"]) == ("user", "Why done?")
    assert body["answer"]["role"] == "agent"
    assert "4.1 NTU" in body["answer"]["text"]

    requests = [
        json.loads(line)
        for line in (scripts / "col.collaboration.json.requests.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
    ]
    first = json.dumps(requests[0]["messages"], ensure_ascii=False)
    # The evidence records as the store holds them (the host recorded the SCADA query).
    for authorised in ("REPORT-SUMMARY-9", "scada_sim", "sha256:", "Step check", "Why done?"):
        assert authorised in first
    everything = json.dumps(requests, ensure_ascii=False)
    for secret in SECRETS:
        assert secret not in everything
    assert all(request["tools"] == ["read_task_context"] for request in requests)
    # The read tool ran for the collaboration and its result came back to the model.
    tool_results = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert json.loads(tool_results[0]["content"])["status"] == "succeeded"


def test_messages_are_paged_oldest_first(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, _, task_id = env
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    for text in ("one", "two"):
        assert client.post(
            f"/api/v1/sessions/{session_id}/messages", json={"text": text}
        ).is_success
    seen: list[tuple[str, str]] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/api/v1/sessions/{session_id}/messages", params=params).json()
        seen += [(m["role"], m["text"]) for m in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [role for role, _ in seen] == ["user", "agent", "user", "agent"]
    assert [seen[0][1], seen[2][1]] == ["one", "two"]
    bad = client.get(f"/api/v1/sessions/{session_id}/messages", params={"cursor": "x"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_cursor")
    # A forged id no store keeps (a lone surrogate, a NUL) is no cursor of ours either.
    for forged in ("\\ud800", "a\\u0000"):  # JSON escapes
        raw = f'["2024-01-01T00:00:00+00:00", "{forged}"]'.encode()
        cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        bad = client.get(f"/api/v1/sessions/{session_id}/messages", params={"cursor": cursor})
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_cursor")


def test_a_write_tool_is_not_available_and_a_failed_answer_stores_nothing(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    rt, scripts, task_id = env
    write(scripts, "col.collaboration", collaboration_turns(tool="save_report"))
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    refused = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Close it"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (502, "model_error")
    page = client.get(f"/api/v1/sessions/{session_id}/messages").json()
    assert page == {"items": [], "next_cursor": None}
    execution_session = rt.tasks.get(task_id).session_id
    wrong = client.post(f"/api/v1/sessions/{execution_session}/messages", json={"text": "hi"})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "not_collaboration")
    missing = client.post("/api/v1/tasks/nope/collaboration")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_the_cli_asks(
    env: tuple[Runtime, Path, str],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, scripts, task_id = env
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_MODEL", f"scripted:{scripts}")
    assert main(["tasks", "ask", task_id, "What was found?"]) == 0
    assert "4.1 NTU" in capsys.readouterr().out
    assert main(["tasks", "ask", "nope", "What?"]) == 1


def test_a_question_with_a_nul_character_is_422_before_the_model_is_asked(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, scripts, task_id = env
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "why\u0000"})
    assert asked.status_code == 422
    assert asked.json()["error"]["details"][0]["field"] == "body.text"
    # Postgres would refuse the question only after the model answered: no call is spent.
    assert not (scripts / "col.collaboration.json.requests.jsonl").exists()
    page = client.get(f"/api/v1/sessions/{session_id}/messages").json()
    assert page == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(
    "answer", ["a NUL \u0000 here", "a lone \ud800 surrogate"], ids=["nul", "surrogate"]
)
def test_an_answer_no_store_can_hold_is_a_model_error_and_stores_nothing(
    env: tuple[Runtime, Path, str], store_url: str, answer: str
) -> None:
    _, scripts, task_id = env
    write(scripts, "col.collaboration", [{"content": answer}])
    app = create_app(load_settings(database_url=store_url, model=f"scripted:{scripts}"))
    with TestClient(app, raise_server_exceptions=False) as client:
        session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
        asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "why?"})
        # The question was fine: not a 422 blaming it, nor a 500.
        assert (asked.status_code, asked.json()["error"]["code"]) == (502, "model_error")
        page = client.get(f"/api/v1/sessions/{session_id}/messages").json()
        assert page == {"items": [], "next_cursor": None}


def test_a_task_has_one_collaboration_session_however_it_is_made(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, _, task_id = env
    body = {"purpose": "task_collaboration", "title": "Questions", "task_id": task_id}
    made = client.post("/api/v1/sessions", json=body)
    assert made.status_code == 201, made.text
    # The task's collaboration route finds the session made through /sessions...
    opened = client.post(f"/api/v1/tasks/{task_id}/collaboration")
    assert (opened.status_code, opened.json()["session_id"]) == (200, made.json()["session_id"])
    # ...and a second one, whose questions no one would read, is refused.
    second = client.post("/api/v1/sessions", json=body)
    assert second.status_code == 409, second.text
    assert second.json()["error"]["code"] == "collaboration_exists"
    assert made.json()["session_id"] in second.json()["error"]["message"]
    listed = client.get("/api/v1/sessions", params={"task_id": task_id})
    purposes = [s["purpose"] for s in listed.json()["items"]]
    assert purposes.count("task_collaboration") == 1


def test_a_long_conversation_gives_the_model_its_latest_messages(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    rt, scripts, task_id = env
    write(scripts, "col.collaboration", [{"content": "ok"}])
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    start = utcnow() - timedelta(hours=1)
    with rt.db.transaction() as conn:  # 150 earlier questions and answers, a second apart
        for index in range(300):
            role, text = ("user", f"question {index // 2}") if index % 2 == 0 else ("agent", "ok")
            insert_message(conn, session_id, role, text, start + timedelta(seconds=index))
    asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "and now?"})
    assert asked.status_code == 201, asked.text
    [request] = [
        json.loads(line)
        for line in (scripts / "col.collaboration.json.requests.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
    ]
    questions = [m["content"] for m in request["messages"] if m["role"] == "user"]
    # The snapshots, as many earlier questions as fit, newest last, then the new question.
    assert questions[-2:] == ["question 149", "and now?"]
    assert "question 0" not in questions
    assert len(request["messages"]) <= 2 + MAX_LIMIT + 1


def test_an_openai_model_is_called_with_the_apis_own_settings(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    _, _, task_id = env
    with OpenAIServer() as server:
        server.reply(content="Zone 4 was turbid.")
        # The server and its key are in the settings the API was made with, not in the
        # environment: the collaboration's model must be called with these.
        settings = load_settings(
            database_url=store_url,
            model="openai:test-model",
            llm_base_url=server.base_url,
            llm_api_key="sk-collaboration",
            llm_timeout_seconds=5,
        )
        with TestClient(create_app(settings)) as client:
            session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
            asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Why?"})
        assert asked.status_code == 201, asked.text
        assert asked.json()["answer"]["text"] == "Zone 4 was turbid."
        [body] = server.bodies
        assert body["messages"][-1] == {"role": "user", "content": "Why?"}


def test_a_key_the_model_repeats_in_an_answer_is_stored_and_served_as_stars(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    _, _, task_id = env
    with OpenAIServer() as server:
        server.reply(content="Zone 4 was turbid; the lab's key is sk-collaboration.")
        with openai_client(store_url, server, llm_api_key="sk-collaboration") as client:
            session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
            path = f"/api/v1/sessions/{session_id}/messages"
            asked = client.post(path, json={"text": "Why?"})
            assert asked.status_code == 201, asked.text
            listed = client.get(path).json()
    assert asked.json()["answer"]["text"] == "Zone 4 was turbid; the lab's key is ***."
    assert "sk-collaboration" not in json.dumps(listed)


def openai_client(store_url: str, server: OpenAIServer, **overrides: Any) -> TestClient:
    settings = load_settings(
        database_url=store_url,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_max_retries=0,
        llm_timeout_seconds=5,
        **overrides,
    )
    return TestClient(create_app(settings))


def test_a_record_the_report_cites_is_shown_however_old(env: tuple[Runtime, Path, str]) -> None:
    """The report keeps what it cites as `evidence_refs`: the snapshots looked for the key
    `evidence_ids`, found none, and a record only the report cited was cut like any other."""
    rt, _, task_id = env
    task = rt.tasks.get(task_id)
    start = utcnow()
    rows = [
        {
            "evidence_id": f"bulk-{n:04d}", "task_id": task_id, "generation": 1,
            "session_id": task.session_id, "source": "scada_sim", "queried_at": start,
            "content_ref": f"sha256:{n:064x}", "origin": "synthetic", "truncated": False,
            "summary": f"reading {n}: " + "turbidity within limits " * 8,
            "created_at": start + timedelta(milliseconds=n),
        }
        for n in range(300)
    ]  # fmt: skip
    with rt.db.transaction() as conn:
        conn.execute(insert(evidence), rows)
        conn.execute(update(reports).where(reports.c.task_id == task_id).values(
            evidence_refs=["bulk-0000"], findings=[]
        ))  # fmt: skip
        shown = [r["evidence_id"] for r in snapshots(conn, task, 1024)["evidence"]]
    # The round's own record (its node cites it), then the oldest of the 300: the report
    # alone cites it.
    assert shown[1] == "bulk-0000"
    assert shown[-1] == "bulk-0299"  # then the newest
    assert len(shown) < 50


def test_an_answer_the_server_cut_short_is_a_model_error_and_stores_nothing(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    # finish_reason "length": half a sentence is not the agent's answer (as in a round).
    _, _, task_id = env
    with OpenAIServer() as server, openai_client(store_url, server) as client:
        server.reply(content="Zone 4 was turbid because the", finish_reason="length")
        session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
        path = f"/api/v1/sessions/{session_id}/messages"
        asked = client.post(path, json={"text": "Why?"})
        assert (asked.status_code, asked.json()["error"]["code"]) == (502, "model_error")
        assert "LLM_MAX_OUTPUT_TOKENS" in asked.json()["error"]["message"]
        assert client.get(path).json() == {"items": [], "next_cursor": None}


def test_a_call_the_server_did_not_parse_is_a_model_error_and_stores_nothing(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    # As in a round: a call written as text is not the agent's answer, and it is not run.
    _, _, task_id = env
    with OpenAIServer() as server, openai_client(store_url, server) as client:
        server.reply(
            content='<tool_call>{"name": "read_task_context", "arguments": {}}</tool_call>'
        )
        session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
        path = f"/api/v1/sessions/{session_id}/messages"
        asked = client.post(path, json={"text": "Why?"})
        assert (asked.status_code, asked.json()["error"]["code"]) == (502, "model_error")
        assert "as text instead of calling it" in asked.json()["error"]["message"]
        assert client.get(path).json() == {"items": [], "next_cursor": None}
        assert len(server.requests) == 1


def test_a_call_with_unreadable_arguments_is_answered_failed_and_not_run(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    # As in a round: the call carries `{}` in the history, but the model is told it ran nothing.
    _, _, task_id = env
    with OpenAIServer() as server, openai_client(store_url, server) as client:
        server.reply(tool_calls=[call("q1", "read_task_context", '{"task_id": ')])
        server.reply(content="I could not read the task.")
        session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
        asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Why?"})
        assert asked.status_code == 201, asked.text
        [answered] = [m for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
    result = json.loads(answered["content"])
    assert (result["status"], result["code"]) == ("failed", "invalid_arguments")
    assert "nothing was run" in result["message"]


@pytest.mark.parametrize("question", ["why\u0000", "why \udcff"], ids=["nul", "surrogate"])
def test_the_cli_refuses_a_question_no_store_can_hold_before_the_model_is_asked(
    env: tuple[Runtime, Path, str],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    question: str,
) -> None:
    # A command line's undecodable bytes arrive as lone surrogates (surrogateescape).
    _, scripts, task_id = env
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_MODEL", f"scripted:{scripts}")
    assert main(["tasks", "ask", task_id, question]) in (1, 2)
    assert "Traceback" not in capsys.readouterr().err
    assert not (scripts / "col.collaboration.json.requests.jsonl").exists()


def test_an_answer_never_reads_the_recovery_built_from_an_execution_transcript(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    # Generation 1 stopped with a call whose outcome is unknown (its recovery snapshot lists
    # the execution's tool calls); generation 2 is queued. The collaboration's read tool shows
    # the task, its plans, reports and evidence, not that trail.
    rt, scripts, task_id = env
    session_1 = rt.tasks.get(task_id).session_id
    assert session_1 is not None
    trail = Snapshot.from_calls(
        [CallRecord("call-TRAIL-SECRET", "call_api", {"note": "TRAIL-ARGUMENT-SECRET"}, 3)],
        reason="the worker stopped",
        generation=1,
    )
    with rt.db.transaction() as conn:
        save_snapshot(conn, session_1, trail)
    rt.tasks.requeue(task_id, "look again")
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    asked = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "Why?"})
    assert asked.status_code == 201, asked.text
    requests = (scripts / "col.collaboration.json.requests.jsonl").read_text(encoding="utf-8")
    assert "read_task_context" in requests  # the tool ran and its result came back
    assert "REPORT-SUMMARY-9" in requests
    for secret in ("call-TRAIL-SECRET", "TRAIL-ARGUMENT-SECRET"):
        assert secret not in requests


def model_calls(scripts: Path) -> int:
    recorded = scripts / "col.collaboration.json.requests.jsonl"
    return len(recorded.read_text(encoding="utf-8").splitlines()) if recorded.exists() else 0


def test_a_retried_ask_with_its_idempotency_key_returns_the_first_answer_and_asks_nothing(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, scripts, task_id = env
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    url = f"/api/v1/sessions/{session_id}/messages"
    key = {"Idempotency-Key": "ask-7f3a"}
    first = client.post(url, json={"text": "Why done?"}, headers=key)
    assert first.status_code == 201, first.text
    calls = model_calls(scripts)
    assert calls > 0
    again = client.post(url, json={"text": "Why done?"}, headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()  # the same question and answer, ids and times
    assert model_calls(scripts) == calls  # the model was not asked again
    other = client.post(url, json={"text": "Why done?"}, headers={"Idempotency-Key": "ask-8"})
    assert other.status_code == 201  # another key is another question
    page = client.get(url).json()["items"]
    assert [m["role"] for m in page] == ["user", "agent", "user", "agent"]


def test_the_same_key_with_another_question_is_409_and_a_bad_key_422_both_before_the_model(
    env: tuple[Runtime, Path, str], client: TestClient
) -> None:
    _, scripts, task_id = env
    session_id = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()["session_id"]
    url = f"/api/v1/sessions/{session_id}/messages"
    assert client.post(url, json={"text": "one"}, headers={"Idempotency-Key": "k1"}).is_success
    calls = model_calls(scripts)
    conflict = client.post(url, json={"text": "two"}, headers={"Idempotency-Key": "k1"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_conflict"
    for bad in ("x" * 201, "two words", "ключ".encode()):
        refused = client.post(url, json={"text": "three"}, headers={"Idempotency-Key": bad})
        assert refused.status_code == 422, bad
        assert refused.json()["error"]["code"] == "invalid_idempotency_key"
    assert model_calls(scripts) == calls
    assert [m["text"] for m in client.get(url).json()["items"]][0::2] == ["one"]


def test_a_retry_that_lands_while_the_first_ask_waits_on_the_model_stores_one_answer(
    env: tuple[Runtime, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two asks with one key at once: both may reach the model, one question is stored and
    both callers get it."""
    rt, _, task_id = env
    service = CollaborationService(rt.db, rt.settings)
    session, _ = service.open(task_id, owner="op")
    answer = service._answer
    inner: list[Answer] = []
    raced: list[str] = []

    def racing(*args: Any) -> str:
        if not raced:  # the retry arrives and finishes while the first one waits
            raced.append("k")
            inner.append(service.ask(session.session_id, "Why?", caller="op", idempotency_key="k"))
        return answer(*args)

    monkeypatch.setattr(service, "_answer", racing)
    outer = service.ask(session.session_id, "Why?", caller="op", idempotency_key="k")
    assert (outer.question, outer.answer) == (inner[0].question, inner[0].answer)
    assert outer.replayed
    assert not inner[0].replayed
    stored, _ = service.messages(session.session_id, caller="op")
    assert [m.message_id for m in stored] == [outer.question.message_id, outer.answer.message_id]

    def conflicting(*args: Any) -> str:
        if raced == ["k"]:
            raced.append("k2")
            service.ask(session.session_id, "Other?", caller="op", idempotency_key="k2")
        return answer(*args)

    monkeypatch.setattr(service, "_answer", conflicting)
    with pytest.raises(ConflictError) as refused:
        service.ask(session.session_id, "Why not?", caller="op", idempotency_key="k2")
    assert refused.value.code == "idempotency_conflict"
    assert len(service.messages(session.session_id, caller="op")[0]) == 4


def test_the_cli_asks_once_per_idempotency_key(
    env: tuple[Runtime, Path, str],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rt, scripts, task_id = env
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_MODEL", f"scripted:{scripts}")
    ask = ["tasks", "ask", task_id, "What was found?", "--idempotency-key", "cli-1"]
    assert main(ask) == 0
    assert main(ask) == 0
    assert "4.1 NTU" in capsys.readouterr().out
    assert main([*ask[:3], "Something else?", *ask[4:]]) == 1
    assert "idempotency_conflict" in capsys.readouterr().err
    service = CollaborationService(rt.db, rt.settings)
    session = service.open(task_id, owner=getpass.getuser())[0]  # the CLI asks as its user
    assert len(service.messages(session.session_id, caller=None)[0]) == 2


def test_an_exchange_answered_sooner_is_not_split_by_the_one_still_waiting(
    env: tuple[Runtime, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two asks at once: the second is answered and stored while the first waits on the model.
    Each exchange stays whole and in the order they were stored, so a page (or a cursor taken
    from it) never has the first question before an exchange and its answer after."""
    rt, _, task_id = env
    service = CollaborationService(rt.db, rt.settings)
    session, _ = service.open(task_id, owner="op")
    answer = service._answer
    nested: list[Answer] = []
    calls: list[str] = []

    def slow_first(*args: Any) -> str:
        calls.append("model")
        if len(calls) == 1:  # the second ask comes in and is stored while the first one waits
            nested.append(service.ask(session.session_id, "Second?", caller="op"))
        return answer(*args)

    monkeypatch.setattr(service, "_answer", slow_first)
    first = service.ask(session.session_id, "First?", caller="op")
    stored, _ = service.messages(session.session_id, caller="op")
    assert [m.text for m in stored if m.role == "user"] == ["Second?", "First?"]
    assert [m.message_id for m in stored] == [
        nested[0].question.message_id,
        nested[0].answer.message_id,
        first.question.message_id,
        first.answer.message_id,
    ]
    page, cursor = service.messages(session.session_id, caller="op", limit=2)
    assert [m.text for m in page if m.role == "user"] == ["Second?"]
    rest, _ = service.messages(session.session_id, caller="op", cursor=cursor)
    assert [m.message_id for m in rest] == [first.question.message_id, first.answer.message_id]


@pytest.fixture
def accounts_client(
    env: tuple[Runtime, Path, str], store_url: str, tmp_path: Path
) -> Iterator[TestClient]:
    _, scripts, _ = env
    settings = load_settings(
        database_url=store_url,
        model=f"scripted:{scripts}",
        operators=operators_file(tmp_path),
        api_token="shared-token",
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_a_collaboration_session_is_its_owners_alone(
    env: tuple[Runtime, Path, str], accounts_client: TestClient
) -> None:
    _, scripts, task_id = env
    client = accounts_client
    otto, alma, vera = (bearer(TOKENS[name]) for name in ("otto", "alma", "vera"))
    opened = client.post(f"/api/v1/tasks/{task_id}/collaboration", headers=otto)
    assert (opened.status_code, opened.json()["owner"]) == (201, "otto")
    ottos = opened.json()["session_id"]
    path = f"/api/v1/sessions/{ottos}/messages"
    assert client.post(path, json={"text": "OTTO-PRIVATE?"}, headers=otto).status_code == 201

    # Another person opening the task's collaboration gets a session of their own...
    theirs = client.post(f"/api/v1/tasks/{task_id}/collaboration", headers=alma)
    assert (theirs.status_code, theirs.json()["owner"]) == (201, "alma")
    assert theirs.json()["session_id"] != ottos
    # ...and can neither read nor add to otto's.
    for headers in (alma, vera):
        read = client.get(path, headers=headers)
        assert (read.status_code, read.json()["error"]["code"]) == (403, "not_session_owner")
    asked = client.post(path, json={"text": "ALMA?"}, headers=alma)
    assert (asked.status_code, asked.json()["error"]["code"]) == (403, "not_session_owner")
    page = client.get(path, headers=otto).json()["items"]
    assert [m["text"] for m in page if m["role"] == "user"] == ["OTTO-PRIVATE?"]

    # Alma's conversation does not carry otto's question to the model.
    alma_path = f"/api/v1/sessions/{theirs.json()['session_id']}/messages"
    assert client.post(alma_path, json={"text": "ALMA?"}, headers=alma).status_code == 201
    requests = (scripts / "col.collaboration.json.requests.jsonl").read_text(encoding="utf-8")
    last = json.loads(requests.splitlines()[-1])
    assert "OTTO-PRIVATE?" not in json.dumps(last["messages"])
    # The shared full-rights token still reads any session (it speaks for others, as `by`).
    shared = client.get(path, headers=bearer("shared-token"))
    assert shared.status_code == 200

    # A session made through /sessions is the caller's, whatever owner the body names.
    body = {"purpose": "ordinary_chat", "title": "Chat", "owner": "otto"}
    made = client.post("/api/v1/sessions", json=body, headers=alma)
    assert (made.status_code, made.json()["owner"]) == (201, "alma")


def test_a_named_account_lists_its_own_collaborations_and_the_tasks_execution_sessions(
    env: tuple[Runtime, Path, str], accounts_client: TestClient
) -> None:
    # The listing showed everyone's collaboration sessions (owner and title) to any account.
    _, _, task_id = env
    client = accounts_client
    otto, alma = bearer(TOKENS["otto"]), bearer(TOKENS["alma"])
    ottos = client.post(f"/api/v1/tasks/{task_id}/collaboration", headers=otto).json()
    almas = client.post(f"/api/v1/tasks/{task_id}/collaboration", headers=alma).json()

    def listed(headers: dict[str, str]) -> dict[str, str]:
        page = client.get(f"/api/v1/sessions?task_id={task_id}", headers=headers)
        assert page.status_code == 200
        return {s["session_id"]: s["purpose"] for s in page.json()["items"]}

    for_alma = listed(alma)
    assert almas["session_id"] in for_alma
    assert ottos["session_id"] not in for_alma
    assert "task_execution" in for_alma.values()  # the task's own sessions stay listed
    everyone = listed(bearer("shared-token"))
    assert {ottos["session_id"], almas["session_id"]} <= everyone.keys()
    # One session fetched by id: the same rule.
    fetched = client.get(f"/api/v1/sessions/{ottos['session_id']}", headers=alma)
    assert (fetched.status_code, fetched.json()["error"]["code"]) == (403, "not_session_owner")
    assert client.get(f"/api/v1/sessions/{almas['session_id']}", headers=alma).status_code == 200
    execution = next(k for k, v in for_alma.items() if v == "task_execution")
    assert client.get(f"/api/v1/sessions/{execution}", headers=alma).status_code == 200


@contextmanager
def statements_sent() -> Iterator[list[tuple[str, Any]]]:
    """The statements any engine sends meanwhile, with their parameters."""
    sent: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        sent.append((statement, params))

    event.listen(Engine, "before_cursor_execute", keep)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", keep)


def evidence_rows_read(rt: Runtime, sent: list[tuple[str, Any]]) -> int:
    """The rows the SELECTs of `sent` on the evidence table returned, sent again (the records
    are as they were)."""
    read = 0
    with rt.db.transaction(readonly=True) as conn:
        for statement, params in sent:
            if statement.lstrip().upper().startswith("SELECT") and "FROM evidence" in statement:
                read += len(conn.exec_driver_sql(statement, params).fetchall())
    return read


def test_a_long_task_s_evidence_is_cut_to_the_window_cited_records_first(
    env: tuple[Runtime, Path, str], store_url: str
) -> None:
    """A task of thousands of records: every one went into the question's first message,
    larger than any model's window (the server refused it, the asker got an error). Now the
    records the report cites come first, then the newest, within a quarter of the window."""
    rt, _, task_id = env
    with rt.db.transaction(readonly=True) as conn:
        (cited,) = [r["evidence_id"] for r in report_store.evidence_of(conn, task_id, 1)]
        session_id = rt.tasks.get(task_id).session_id
        start = utcnow()
    rows = [
        {
            "evidence_id": f"bulk-{n:05d}",
            "task_id": task_id,
            "generation": 1,
            "session_id": session_id,
            "source": "scada_sim",
            "queried_at": start,
            "content_ref": f"sha256:{n:064x}",
            "origin": "synthetic",
            "truncated": False,
            "summary": f"reading {n}: " + "turbidity within limits " * 8,
            "created_at": start + timedelta(milliseconds=n),
        }
        for n in range(3_000)
    ]
    with rt.db.transaction() as conn:
        conn.execute(insert(evidence), rows)
    with OpenAIServer() as server:
        server.reply(content="Zone 4 was turbid.")
        with openai_client(store_url, server, llm_context_window=8192) as client:
            opened = client.post(f"/api/v1/tasks/{task_id}/collaboration").json()
            with statements_sent() as sent:
                asked = client.post(
                    f"/api/v1/sessions/{opened['session_id']}/messages", json={"text": "Why?"}
                )
        assert asked.status_code == 201, asked.text
        [body] = server.bodies
    # The store was asked for about the records sent, not every one before they were cut.
    assert evidence_rows_read(rt, sent) < 200  # was all 3,001
    snapshot = json.loads(body["messages"][1]["content"].split("\n", 1)[1])
    shown = [record["evidence_id"] for record in snapshot["evidence"]]
    assert shown[0] == cited  # cited, and oldest first as stored
    assert shown[-1] == "bulk-02999"  # then the newest
    assert 10 < len(shown) < 3_001
    assert snapshot["evidence_not_shown"] == 3_001 - len(shown)
    # About a quarter of the window: 2,048 tokens, a few characters each.
    assert len(body["messages"][1]["content"]) < 2048 * 6
