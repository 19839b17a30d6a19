"""`GET /api/v1/tasks/{id}/evidence` and `orchestrator tasks evidence ID` a page at a time.

Before, the route answered every record of the task at once with `next_cursor` always null
(thousands of records: ~700 KB, and a client following the cursor was told nothing followed).
The records here share their `created_at` in runs, so a page boundary falls inside a tie.
"""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, text

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import evidence as evidence_store
from orchestrator.store.db import Database
from orchestrator.store.tables import evidence, sessions
from tests.executions_support import runtime_for
from tests.query_plans import rows_scanned

BASE = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    db = Database.from_url(store_url)
    app = create_app(load_settings(database_url=store_url, home=tmp_path / "home"), db=db)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    db.dispose()


def task_with_records(rt: Runtime, stamps: list[datetime]) -> tuple[str, list[str]]:
    """A task with one record per stamp (its `created_at`); their ids in the list's order."""
    task_id = rt.tasks.trigger(Trigger(task_type="paged", title="t")).task.task_id
    rows: list[dict[str, Any]] = []
    with rt.db.transaction() as conn:
        session_id = str(uuid.uuid4())
        conn.execute(
            insert(sessions),
            {
                "session_id": session_id,
                "purpose": "task_execution",
                "task_id": task_id,
                "generation": 1,
                "owner": f"task:{task_id}",
                "title": "t",
                "created_at": BASE,
                "updated_at": BASE,
            },
        )
        for n, stamp in enumerate(stamps):
            rows.append(
                {
                    "evidence_id": str(uuid.uuid4()),
                    "task_id": task_id,
                    "generation": 1,
                    "session_id": session_id,
                    "source": "scada_sim",
                    "queried_at": stamp,
                    "content_ref": f"sha256:{n:064x}",
                    "origin": "synthetic",
                    "truncated": False,
                    "summary": f"record {n}",
                    "created_at": stamp,
                }
            )
        conn.execute(insert(evidence), rows)
    ordered = sorted(rows, key=lambda row: (row["created_at"], row["evidence_id"]))
    return task_id, [row["evidence_id"] for row in ordered]


def tied_stamps() -> list[datetime]:
    """Seven records: one alone, five at one instant, one after; pages of 2 cut the five."""
    return [BASE, *[BASE + timedelta(seconds=1)] * 5, BASE + timedelta(seconds=2)]


def test_the_evidence_comes_a_page_at_a_time_through_a_tie(rt: Runtime, client: TestClient) -> None:
    task_id, ids = task_with_records(rt, tied_stamps())
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        query: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = client.get(f"/api/v1/tasks/{task_id}/evidence", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        pages += 1
        assert len(body["items"]) == (2 if pages < 4 else 1)
        seen += [item["evidence_id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    # Every record once, oldest first, the tied ones by id: none repeated, none skipped.
    assert seen == ids
    assert pages == 4
    # The default page holds them all, and says nothing follows.
    whole = client.get(f"/api/v1/tasks/{task_id}/evidence").json()
    assert [item["evidence_id"] for item in whole["items"]] == ids
    assert whole["next_cursor"] is None


def test_a_long_task_s_first_page_is_a_page(rt: Runtime, client: TestClient) -> None:
    stamps = [BASE + timedelta(milliseconds=n) for n in range(250)]
    task_id, ids = task_with_records(rt, stamps)
    first = client.get(f"/api/v1/tasks/{task_id}/evidence").json()
    assert [item["evidence_id"] for item in first["items"]] == ids[:100]
    assert first["next_cursor"]
    most = client.get(f"/api/v1/tasks/{task_id}/evidence", params={"limit": 200}).json()
    assert len(most["items"]) == 200
    for limit in (0, 201):
        refused = client.get(f"/api/v1/tasks/{task_id}/evidence", params={"limit": limit})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "invalid_request"


def test_the_cited_records_are_found_by_id_wherever_they_fall(
    rt: Runtime, client: TestClient
) -> None:
    task_id, ids = task_with_records(rt, tied_stamps())
    _, other_ids = task_with_records(rt, [BASE])
    wanted = [ids[6], ids[0], other_ids[0], "not-a-record"]
    response = client.get(f"/api/v1/tasks/{task_id}/evidence", params={"id": wanted})
    assert response.status_code == 200, response.text
    # Its own records among them, oldest first; another task's record is not this task's.
    assert [item["evidence_id"] for item in response.json()["items"]] == [ids[0], ids[6]]
    too_many = client.get(
        f"/api/v1/tasks/{task_id}/evidence", params={"id": [str(n) for n in range(201)]}
    )
    assert too_many.status_code == 422
    assert too_many.json()["error"]["code"] == "too_many_ids"
    for bad in ("a\x00b", "x" * 37):
        refused = client.get(f"/api/v1/tasks/{task_id}/evidence", params={"id": [bad]})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "invalid_evidence_id"


@pytest.mark.parametrize("cursor", ["nope", "W10", "WyJ4IiwgInkiXQ", "x" * 513])
def test_a_cursor_the_api_did_not_send_is_a_422_with_a_code(
    rt: Runtime, client: TestClient, cursor: str
) -> None:
    task_id, _ = task_with_records(rt, [BASE])
    response = client.get(f"/api/v1/tasks/{task_id}/evidence", params={"cursor": cursor})
    assert response.status_code == 422, response.text
    code = response.json()["error"]["code"]
    assert code == ("invalid_request" if len(cursor) > 512 else "invalid_cursor")


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from orchestrator.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses an option before any handler runs
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_pages_and_prints_the_next_page_s_command(
    rt: Runtime,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    task_id, ids = task_with_records(rt, tied_stamps())
    argv = ["tasks", "evidence", task_id, "--limit", "3"]
    seen: list[str] = []
    pages = 0
    while True:
        code, out, err = cli(argv, capsys)
        assert (code, err) == (0, "")
        pages += 1
        lines = out.splitlines()
        assert lines[0].startswith("EVIDENCE")
        seen += [line.split()[0] for line in lines[1::2] if not line.startswith("next page:")]
        if not lines[-1].startswith("next page: "):
            break
        argv = shlex.split(lines[-1].removeprefix("next page: "))[1:]
        assert argv[:5] == ["tasks", "evidence", task_id, "--limit", "3"]
    assert (seen, pages) == (ids, 3)
    # As JSON: stdout stays one array, the next page's command goes beside it.
    code, out, err = cli(["tasks", "evidence", task_id, "--json", "--limit", "4"], capsys)
    assert [item["evidence_id"] for item in json.loads(out)] == ids[:4]
    assert err.startswith(f"next page: orchestrator tasks evidence {task_id} --limit 4 --json")
    for bad in (["--limit", "0"], ["--limit", "201"], ["--cursor", "nope"]):
        code, out, err = cli(["tasks", "evidence", task_id, *bad], capsys)
        assert code == 2, bad
        assert err.strip().startswith(f"orchestrator tasks evidence: argument {bad[0]}: ")
        assert len(err.strip().splitlines()) == 1


def test_a_deep_page_of_a_task_s_evidence_reads_its_own_rows(pg_url: str) -> None:
    """5,000 records of one task (and as many of another): a page after 2,000 of them reads
    about its own rows from the (task_id, created_at, evidence_id) index; the first page too.
    With only the (task_id, generation) index each page read and sorted all 5,000."""
    db = Database.from_url(pg_url)
    try:
        with db.transaction() as conn:
            for task_id in ("t1", "t2"):
                conn.execute(
                    text(
                        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id,"
                        " origin, status, generation, created_at, updated_at) VALUES (:t, 'x',"
                        " 't', '{}', :t, 'live', 'running', 1, :at, :at)"
                    ),
                    {"t": task_id, "at": BASE},
                )
                conn.execute(
                    text(
                        "INSERT INTO sessions (session_id, purpose, task_id, generation, owner,"
                        " title, created_at, updated_at) VALUES ('s' || :t, 'task_execution',"
                        " :t, 1, 'task:' || :t, 't', :at, :at)"
                    ),
                    {"t": task_id, "at": BASE},
                )
            conn.execute(
                text(
                    "INSERT INTO evidence (evidence_id, task_id, generation, session_id, source,"
                    " queried_at, content_ref, origin, truncated, summary, created_at)"
                    " SELECT t || '-' || lpad(i::text, 6, '0'), t, 1, 's' || t, 'scada_sim',"
                    " :at, 'sha256:0', 'synthetic', false, 'read',"
                    " :at + (i / 2) * interval '1 millisecond'"  # pairs share their time
                    " FROM generate_series(1, 5000) i, (VALUES ('t1'), ('t2')) AS v(t)"
                ),
                {"at": BASE},
            )
            conn.execute(text("ANALYZE evidence"))
        with db.transaction(readonly=True) as conn:
            _, last = evidence_store.evidence_page(conn, "t1", limit=2000)
        assert last is not None
        page: list[dict[str, Any]] = []

        def read(conn: Any) -> None:
            page.extend(evidence_store.evidence_page(conn, "t1", limit=100, after=last)[0])

        assert rows_scanned(db, read) < 300
        assert [item["evidence_id"] for item in page] == [f"t1-{n:06d}" for n in range(2001, 2101)]

        def first(conn: Any) -> None:
            evidence_store.evidence_page(conn, "t1", limit=100)

        assert rows_scanned(db, first) < 300
    finally:
        db.dispose()
