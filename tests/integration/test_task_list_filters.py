"""`GET /api/v1/tasks` filters by status, task type and created-time range on the server, and
the cursor pages through exactly the filtered rows."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.api.tasks import get_task_service
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.settings import load_settings
from orchestrator.store.db import Database
from orchestrator.store.tables import tasks

START = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def db(store_url: str) -> Iterator[Database]:
    database = Database.from_url(store_url)
    yield database
    database.dispose()


@pytest.fixture
def service(db: Database) -> TaskService:
    return TaskService(db, RecordingDispatcher())


@pytest.fixture
def client(store_url: str, tmp_path: Path, db: Database, service: TaskService) -> Iterator[Any]:
    app = create_app(load_settings(database_url=store_url, home=tmp_path / "home"), db=db)
    app.dependency_overrides[get_task_service] = lambda: service
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def made(db: Database, service: TaskService) -> list[dict[str, Any]]:
    """Twelve tasks, one a day from START; types alternate pump/valve; every third cancelled.
    Two share one created_at, so the cursor's tie-break on task_id is exercised."""
    rows = []
    for day in range(12):
        kind = "pump" if day % 2 == 0 else "valve"
        task = service.trigger(Trigger(task_type=kind, title=f"day {day}")).task
        created = START + timedelta(days=min(day, 10))  # days 10 and 11 share a time
        with db.transaction() as conn:
            conn.execute(
                update(tasks).where(tasks.c.task_id == task.task_id).values(created_at=created)
            )
        if day % 3 == 0:
            service.cancel(task.task_id, "not needed")
        rows.append({"task_id": task.task_id, "type": kind, "created": created, "day": day})
    return rows


def expected(made: list[dict[str, Any]], keep: Any) -> list[str]:
    chosen = [row for row in made if keep(row)]
    chosen.sort(key=lambda row: (row["created"], row["task_id"]), reverse=True)
    return [row["task_id"] for row in chosen]


def every_page(client: TestClient, params: dict[str, Any], limit: int) -> list[str]:
    found: list[str] = []
    cursor = None
    for _ in range(50):
        answer = client.get("/api/v1/tasks", params={**params, "limit": limit, "cursor": cursor})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["items"]) <= limit
        found += [item["task_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return found
    raise AssertionError("the pages never ended")


def test_filters_combine_and_page_without_repeat_or_gap(
    client: TestClient, made: list[dict[str, Any]]
) -> None:
    after, before = START + timedelta(days=2), START + timedelta(days=10)
    cases: list[tuple[dict[str, Any], Any]] = [
        ({}, lambda r: True),
        ({"task_type": "pump"}, lambda r: r["type"] == "pump"),
        ({"created_after": after.isoformat()}, lambda r: r["created"] >= after),
        ({"created_before": before.isoformat()}, lambda r: r["created"] < before),
        (
            {"task_type": "valve", "created_after": after.isoformat(), "status": "queued"},
            lambda r: r["type"] == "valve" and r["created"] >= after and r["day"] % 3 != 0,
        ),
        (
            {"created_after": after.isoformat(), "created_before": before.isoformat()},
            lambda r: after <= r["created"] < before,
        ),
        (
            {"status": "cancelled", "task_type": "pump"},
            lambda r: r["type"] == "pump" and r["day"] % 3 == 0,
        ),
        ({"task_type": "nothing-of-this-type"}, lambda r: False),
    ]
    for params, keep in cases:
        want = expected(made, keep)
        for limit in (1, 2, 5, 200):
            assert every_page(client, params, limit) == want, (params, limit)


def test_a_time_without_a_zone_is_utc_and_another_zone_is_converted(
    client: TestClient, made: list[dict[str, Any]]
) -> None:
    day_five = START + timedelta(days=5)
    naive = client.get("/api/v1/tasks", params={"created_after": "2026-11-06T00:00:00"})
    plus_two = client.get("/api/v1/tasks", params={"created_after": "2026-11-06T02:00:00+02:00"})
    want = expected(made, lambda r: r["created"] >= day_five)  # inclusive
    assert [t["task_id"] for t in naive.json()["items"]] == want
    assert [t["task_id"] for t in plus_two.json()["items"]] == want


@pytest.mark.parametrize(
    ("params", "code", "field"),
    [
        ({"created_after": "yesterday"}, "invalid_request", "query.created_after"),
        ({"created_before": "2026-13-01T00:00:00Z"}, "invalid_request", "query.created_before"),
        ({"task_type": "../etc"}, "invalid_request", "query.task_type"),
        ({"task_type": "x" * 65}, "invalid_request", "query.task_type"),
        ({"task_type": ""}, "invalid_request", "query.task_type"),
        ({"status": "sleeping"}, "invalid_request", "query.status"),
        (
            {"created_after": "2026-11-05T00:00:00Z", "created_before": "2026-11-05T00:00:00Z"},
            "invalid_time_range",
            "created_before",
        ),
        (
            {"created_after": "2026-11-06T00:00:00Z", "created_before": "2026-11-05T00:00:00Z"},
            "invalid_time_range",
            "created_before",
        ),
        ({"created_after": "0001-01-01T00:00:00+14:00"}, "invalid_time", "created_after"),
        ({"created_before": "9999-12-31T23:59:59-14:00"}, "invalid_time", "created_before"),
        ({"cursor": "nope!", "task_type": "pump"}, "invalid_cursor", "cursor"),
    ],
)
def test_invalid_filters_are_422_with_the_envelope(
    client: TestClient, params: dict[str, Any], code: str, field: str
) -> None:
    answer = client.get("/api/v1/tasks", params=params)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["details"][0]["field"]) == (code, field)
    assert error["details"][0]["code"] == code


@pytest.mark.parametrize(
    "params",
    [
        {"created_after": "0001-01-01T00:00:00Z"},
        {"created_before": "9999-12-31T23:59:59.999999Z"},
        {"created_after": "0001-01-01T00:00:00Z", "created_before": "9999-12-31T23:59:59Z"},
        {"created_after": "1700000000"},  # seconds since the epoch, as pydantic reads them
        {"task_type": "a" * 64},
    ],
)
def test_the_ends_of_the_calendar_are_accepted_by_both_stores(
    client: TestClient, params: dict[str, Any]
) -> None:
    answer = client.get("/api/v1/tasks", params=params)
    assert answer.status_code == 200, answer.text


def test_the_filters_are_in_the_openapi_document(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/api/v1/tasks"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert {"status", "task_type", "created_after", "created_before", "cursor", "limit"} <= set(
        params
    )
    after = params["created_after"]["schema"]["anyOf"][0]
    assert after == {"type": "string", "format": "date-time"}
    assert params["task_type"]["schema"]["anyOf"][0]["pattern"]
    assert "422" in operation["responses"]


def cli(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> tuple[str, str]:
    from orchestrator.cli import main

    assert main(argv) == code
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_cli_pages_with_the_printed_command(
    made: list[dict[str, Any]],
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    after = (START + timedelta(days=2)).isoformat()
    argv = ["tasks", "list", "--type", "pump", "--since", after, "--limit", "2"]
    seen: list[str] = []
    for _ in range(10):
        out, err = cli(argv, capsys)
        assert err == ""
        lines = out.splitlines()
        assert lines[0].startswith("TASK")
        seen += [line.split()[0] for line in lines[1:] if not line.startswith("next page:")]
        if not lines[-1].startswith("next page: "):
            break
        argv = shlex.split(lines[-1].removeprefix("next page: "))[1:]
        assert argv[:6] == ["tasks", "list", "--type", "pump", "--since", after]
    want = expected(made, lambda r: r["type"] == "pump" and r["created"] >= START + timedelta(2))
    assert seen == want

    out, err = cli(["tasks", "list", "--json", "--limit", "3"], capsys)
    assert [t["task_id"] for t in json.loads(out)] == expected(made, lambda r: True)[:3]
    assert err.startswith("next page: orchestrator tasks list --limit 3 --cursor ")
    until = (START + timedelta(days=1)).isoformat()
    out, err = cli(["tasks", "list", "--json", "--until", until], capsys)
    assert [t["task_id"] for t in json.loads(out)] == [made[0]["task_id"]]
    assert err == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--since", "yesterday"], "argument --since: not an ISO-8601 time"),
        (["--until", "2026-02-30"], "argument --until: not an ISO-8601 time"),
        (["--cursor", "nope!"], "argument --cursor: cursor is not one this API returned"),
        (["--type", "no spaces"], "invalid --type: a task type is"),
        (["--since", "1d", "--until", "2d"], "invalid --until: --since must be earlier"),
    ],
)
def test_bad_cli_filters_are_one_line_and_exit_2(
    args: list[str], needle: str, sqlite_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_DATABASE_URL=sqlite_url, ORCH_HOME=str(tmp_path / "home"))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "orchestrator"), "tasks", "list", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert needle in result.stderr


def test_control_characters_in_a_title_cannot_forge_cli_lines_or_reach_the_terminal(
    service: TaskService,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A trigger's title comes from the business backend: a newline would print a forged row,
    # an escape sequence would drive the operator's terminal.
    title = "pump\nffffffff-0000-0000-0000-000000000000  completed  1  fake\x1b[2J\x9b1m"
    task_id = service.trigger(Trigger(task_type="pump", title=title)).task.task_id
    service.cancel(task_id, "why\r\x1b[31m not")
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    out, _ = cli(["tasks", "list"], capsys)
    assert len(out.splitlines()) == 2  # the header and one row
    assert "pump\\nffffffff-0000" in out
    shown, _ = cli(["tasks", "show", task_id], capsys)
    for text in (out, shown):
        assert not any(c in text for c in "\x1b\x9b\r")
    assert "last error: why\\r\\x1b[31m not" in shown


def test_a_long_task_type_is_listed_whole_with_the_columns_aligned(
    service: TaskService,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The type column was cut at 20 characters: `water_quality_complai` for two types that
    differ after it. It widens to the longest type shown; a page of short ones is as before."""
    long_type = "water_quality_complaint.north:" + "x" * 34  # 64, the longest a type may be
    short_id = service.trigger(Trigger(task_type="pump", title="short")).task.task_id
    long_id = service.trigger(Trigger(task_type=long_type, title="long")).task.task_id
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    out, _ = cli(["tasks", "list"], capsys)
    header, *rows = out.splitlines()
    row = {line.split()[0]: line for line in rows}
    assert row[long_id].split()[3] == long_type
    # The created time and the title start where the header says, in every row.
    for line in (row[long_id], row[short_id]):
        assert line.index(line.split()[4]) == header.index("CREATED")
        assert line.endswith(("  short", "  long"))
    assert header.index("CREATED") - header.index("TYPE") == len(long_type) + 2
    only_short, _ = cli(["tasks", "list", "--type", "pump"], capsys)
    assert only_short.splitlines()[0] == header.replace(" " * (len(long_type) - 20), "", 1)
