"""Many pending approvals: a count the API serves without listing them, and a list an approver
reads oldest first, a page at a time, however many wait.

The actions are written as the store writes them (`insert_action`'s row), many at once.
"""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, update

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from orchestrator.store import Database
from orchestrator.store.tables import actions, tasks
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for


def seed(db: Database, task_id: str, count: int, status: str = "pending_approval") -> list[str]:
    """`count` actions of the task, three to a timestamp (a page boundary falls inside a tie);
    their ids oldest first, in the order (created_at, action_id)."""
    with db.transaction() as conn:
        session_id = conn.execute(
            select(tasks.c.session_id).where(tasks.c.task_id == task_id)
        ).scalar_one()
        start = utcnow() - timedelta(days=1)
        rows: list[dict[str, Any]] = [
            {
                "action_id": str(uuid.uuid4()),
                "task_id": task_id,
                "generation": 1,
                "session_id": session_id,
                "node_id": f"n{n}",
                "kind": "work_order",
                "payload": {"n": n},
                "status": status,
                "decided_by": None if status == "pending_approval" else "ops",
                "created_at": start + timedelta(seconds=n // 3),
                "plan_revision": 1,
                "digest": "0" * 64,
            }
            for n in range(count)
        ]
        conn.execute(insert(actions), rows)
    return [r["action_id"] for r in sorted(rows, key=lambda r: (r["created_at"], r["action_id"]))]


@pytest.fixture
def client(store_url: str, tmp_path: Any) -> Iterator[tuple[TestClient, Database, str, str]]:
    rt, _ = runtime_for(store_url, tmp_path / "scripts")
    first = rt.tasks.trigger(Trigger(task_type="wo", title="Many waiting")).task.task_id
    second = rt.tasks.trigger(Trigger(task_type="wo", title="A few waiting")).task.task_id
    rt.close()
    db = Database.from_url(store_url)
    with TestClient(create_app(load_settings(database_url=store_url))) as http:
        yield http, db, first, second
    db.dispose()


def test_the_pending_count_counts_only_what_waits(
    client: tuple[TestClient, Database, str, str],
) -> None:
    http, db, first, second = client
    seed(db, first, 230)
    seed(db, second, 4)
    seed(db, second, 50, status="approved")
    assert http.get("/api/v1/actions/pending-count").json() == {"pending": 234}
    mine = http.get("/api/v1/actions/pending-count", params={"task_id": second})
    assert mine.json() == {"pending": 4}
    # A mistyped task id is said to name no task (as the list says it), not "none waits".
    unknown = http.get("/api/v1/actions/pending-count", params={"task_id": "no-such-task"})
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["error"]["code"] == "not_found"
    assert "no-such-task" in unknown.json()["error"]["message"]
    # A task whose actions were all superseded has none pending: 0.
    with db.transaction() as conn:
        conn.execute(update(actions).where(actions.c.task_id == second).values(status="superseded"))
    none = http.get("/api/v1/actions/pending-count", params={"task_id": second})
    assert none.json() == {"pending": 0}


def test_pending_actions_page_oldest_first_without_repeats_or_gaps(
    client: tuple[TestClient, Database, str, str],
) -> None:
    http, db, first, _ = client
    oldest_first = seed(db, first, 230)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"order": "oldest", "limit": 50}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/api/v1/actions", params=params).json()
        seen += [item["action_id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert pages == 5
    assert seen == oldest_first
    # Newest first (the default) is the same rows the other way round, page for page.
    newest = http.get("/api/v1/actions", params={"limit": 200}).json()
    rest = http.get("/api/v1/actions", params={"limit": 200, "cursor": newest["next_cursor"]})
    items = newest["items"] + rest.json()["items"]
    assert [item["action_id"] for item in items] == oldest_first[::-1]


def test_an_unknown_order_is_a_clear_422(client: tuple[TestClient, Database, str, str]) -> None:
    http, *_ = client
    answer = http.get("/api/v1/actions", params={"order": "sideways"})
    assert answer.status_code == 422
    assert answer.json()["error"]["details"][0]["field"] == "query.order"


def test_the_cli_lists_pending_actions_a_page_at_a_time_oldest_first(
    store_url: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`actions list` with thousands pending: before, it printed the 100 newest and stopped,
    with no word of the others, so the longest waiting never showed."""
    rt, _ = runtime_for(store_url, tmp_path / "scripts")
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Many waiting")).task.task_id
    rt.close()
    db = Database.from_url(store_url)
    oldest_first = seed(db, task_id, 7)
    db.dispose()
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    argv = ["actions", "list", "--oldest", "--limit", "3"]
    seen: list[str] = []
    pages = 0
    while argv:
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        pages += 1
        assert lines[0] == f"7 pending; {3 if pages < 3 else 1} on this page"
        seen += [line.split()[0] for line in lines[1:] if not line.startswith("next page:")]
        more = [line for line in lines if line.startswith("next page: ")]
        argv = shlex.split(more[0].removeprefix("next page: "))[1:] if more else []
    assert (pages, seen) == (3, oldest_first)
    # Newest first (the default), in JSON: stdout stays one array, the way on goes to stderr.
    assert main(["actions", "list", "--limit", "5", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [a["action_id"] for a in json.loads(out)] == oldest_first[::-1][:5]
    assert err.startswith("next page: orchestrator actions list --status pending_approval")
    with pytest.raises(SystemExit) as refused:
        main(["actions", "list", "--cursor", "not-a-cursor"])
    assert refused.value.code == 2
    assert "argument --cursor: cursor is not one" in capsys.readouterr().err


def test_a_cursor_asked_of_the_list_in_the_other_order_is_refused_not_an_empty_page(
    client: tuple[TestClient, Database, str, str],
) -> None:
    """`order=oldest`'s cursor sent to the newest-first list answered `[]`: the rows after the
    oldest one, newest first, are none. Each order's cursor is refused by the other, saying so."""
    http, db, first, _ = client
    seed(db, first, 5)
    oldest = http.get("/api/v1/actions", params={"order": "oldest", "limit": 2}).json()
    newest = http.get("/api/v1/actions", params={"limit": 2}).json()
    assert oldest["next_cursor"]
    assert newest["next_cursor"]
    for cursor, asked, said in (
        (oldest["next_cursor"], {}, "oldest-first"),
        (newest["next_cursor"], {"order": "oldest"}, "newest-first"),
    ):
        answer = http.get("/api/v1/actions", params={"cursor": cursor, **asked})
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_cursor"
        assert f"cursor is from the {said} list" in error["message"]
    # Each in its own order goes on.
    on = http.get("/api/v1/actions", params={"order": "oldest", "cursor": oldest["next_cursor"]})
    assert on.status_code == 200
    assert len(on.json()["items"]) == 3
