"""The API as an attacker meets it: credentials that are no credentials, and (without a token)
pages of other sites reaching the loopback API."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import create_app
from orchestrator.api.console import _RedactToken
from orchestrator.operators import Account, Operator, find_account, find_operator
from orchestrator.settings import SettingsError, load_settings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

#: The hash `printf %s "$TOKEN" | sha256sum` prints when $TOKEN is unset: the empty string's.
EMPTY_HASH = hashlib.sha256(b"").hexdigest()


def make_client(sqlite_url: str, tmp_path: Path, **overrides: Any) -> TestClient:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, redis_url=None, **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


def test_an_operators_file_with_the_empty_tokens_hash_stops_start_up(
    sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "operators"
    path.write_text(f"eve approver {EMPTY_HASH}\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="line 1: the token hash is the empty token's"):
        create_app(load_settings(database_url=sqlite_url, home=tmp_path, operators=path))


@pytest.mark.parametrize("header", ["Bearer ", "Bearer", "Bearer    ", "bearer \t"])
def test_an_empty_bearer_token_names_no_account(
    sqlite_url: str, tmp_path: Path, header: str
) -> None:
    path = tmp_path / "operators"
    path.write_text(f"vera viewer {hashlib.sha256(b'vera-token').hexdigest()}\n", "utf-8")
    with make_client(sqlite_url, tmp_path, operators=path) as client:
        answer = client.get("/api/v1/actions", headers={"Authorization": header})
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "unauthorized"
        ok = client.get("/api/v1/actions", headers={"Authorization": "Bearer vera-token"})
        assert ok.status_code == 200, ok.text


def test_an_empty_token_names_no_account_whatever_the_accounts_hold() -> None:
    """Defence in depth behind the file's check: an account given the empty string's hash
    (by code, or a file read before the check existed) is not found by an empty token, on
    the bearer path and the console's sign-in alike (both find accounts this way)."""
    eve = Account(Operator("eve", "approver"), bytes.fromhex(EMPTY_HASH))
    assert find_account(b"", [eve]) is None
    assert find_operator(b"", [eve], None) is None
    assert find_account(b"x", [eve]) is None


# ---- an open API (no token) against other sites' pages ---------------------------------------
# TestClient puts the base URL's host and port in the ASGI scope's `server`, as uvicorn puts the
# socket it accepted on: 127.0.0.1 here, the loopback address `orchestrator api` listens on
# when no token is set.
LOOPBACK = "http://127.0.0.1:8000"
TRIGGER = {"task_type": "t", "title": "Pressure drop", "context": {}}


@pytest.fixture
def open_api(sqlite_url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, redis_url=None)
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        yield client


def queued_task(client: TestClient) -> str:
    answer = client.post("/api/v1/tasks", json=TRIGGER)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["task_id"])


def test_an_open_api_refuses_a_cross_site_form_post(open_api: TestClient) -> None:
    task_id = queued_task(open_api)
    # What a browser sends for <form method=post action=".../cancel"> on another site.
    forged = open_api.post(
        f"/api/v1/tasks/{task_id}/cancel",
        content=b"",
        headers={
            "Origin": "https://evil.example",
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    assert forged.status_code == 403, forged.text
    assert forged.json()["error"]["code"] == "forbidden"
    assert "another origin" in forged.json()["error"]["message"]
    assert open_api.get(f"/api/v1/tasks/{task_id}").json()["status"] == "queued"
    # The console's own page (same origin) and a program (no Origin) still write.
    own = open_api.post(
        f"/api/v1/tasks/{task_id}/requeue",
        json={"reason": "again"},
        headers={"Origin": LOOPBACK, "X-Orch-Console": "1"},
    )
    assert own.status_code == 200, own.text
    cancelled = open_api.post(f"/api/v1/tasks/{task_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


def test_an_open_api_refuses_a_rebound_host_name(open_api: TestClient) -> None:
    task_id = queued_task(open_api)
    # DNS rebinding: evil.example now resolves to 127.0.0.1, and its page calls "its" host,
    # same-origin, so no Origin check could tell; the Host header still names evil.example.
    rebound = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}
    read = open_api.get("/api/v1/tasks", headers={"Host": "evil.example:8000"})
    assert read.status_code == 403, read.text
    assert "localhost, 127.0.0.1 or [::1]" in read.json()["error"]["message"]
    assert task_id not in read.text
    cancel = open_api.post(f"/api/v1/tasks/{task_id}/cancel", headers=rebound)
    assert cancel.status_code == 403
    assert open_api.get("/console", headers={"Host": "evil.example:8000"}).status_code == 403
    assert open_api.get(f"/api/v1/tasks/{task_id}").json()["status"] == "queued"
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
        assert open_api.get("/api/v1/tasks", headers={"Host": host}).status_code == 200, host


def test_a_front_end_listed_in_cors_origins_writes_to_an_open_api(
    sqlite_url: str, tmp_path: Path
) -> None:
    front = "http://localhost:5173"
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, cors_origins=front
    )
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        answer = client.post("/api/v1/tasks", json=TRIGGER, headers={"Origin": front})
        assert answer.status_code == 201, answer.text
        other = client.post("/api/v1/tasks", json=TRIGGER, headers={"Origin": "null"})
        assert other.status_code == 403


def test_with_a_token_the_guard_stays_out_of_the_way(sqlite_url: str, tmp_path: Path) -> None:
    # Behind a proxy the Host may be any name; the token keeps other sites out there.
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, api_token="tok-123456"
    )
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        headers = {"Host": "ops.example.com", "Authorization": "Bearer tok-123456"}
        assert client.get("/api/v1/tasks", headers=headers).status_code == 200


# ---- open streams and the accounts they were opened with --------------------------------------
KEEPALIVE = 0.2


def write_operators(path: Path, names: dict[str, tuple[str, str]]) -> None:
    """The operators file in one step (a new file moved over the old), as
    docs/people-in-the-loop.md asks."""
    lines = [
        f"{name} {role} {hashlib.sha256(token.encode()).hexdigest()}"
        for name, (role, token) in names.items()
    ]
    fresh = path.with_suffix(".new")
    fresh.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fresh.replace(path)


def lines_until_the_end(lines: Iterator[str], keepalives: int) -> tuple[bool, int]:
    """Read a stream until it ends or `keepalives` more keep-alives came: (ended, seen)."""
    seen = 0
    for line in lines:
        if line == "event: keepalive":
            seen += 1
            if seen >= keepalives:
                return False, seen
    return True, seen


@pytest.mark.parametrize("stream", ["task", "plan"])
def test_an_open_stream_ends_once_its_account_is_taken_out(
    sqlite_url: str, tmp_path: Path, stream: str
) -> None:
    path = tmp_path / "operators"
    accounts = {"vera": ("viewer", "vera-token"), "alma": ("approver", "alma-token")}
    write_operators(path, accounts)
    settings = load_settings(database_url=sqlite_url, home=tmp_path, redis_url=None, operators=path)
    app = create_app(settings, keepalive_seconds=KEEPALIVE)
    with TestClient(app, raise_server_exceptions=False) as client:
        alma = {"Authorization": "Bearer alma-token"}
        task = client.post("/api/v1/tasks", json=TRIGGER, headers=alma).json()
        # vera follows it from the console: the stream authenticated by her session cookie.
        signed_in = client.post("/console/session", data={"token": "vera-token"})
        assert signed_in.status_code == 200, signed_in.text  # the redirect to /console
        url = (
            f"/api/v1/tasks/{task['task_id']}/stream"
            if stream == "task"
            else f"/api/v1/agent/chat/session/{task['session_id']}/stream"
        )
        with client.stream("GET", url) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(lines) == "event: state"
            # Still hers while she is in the file: the keep-alives go on.
            assert lines_until_the_end(lines, 3) == (False, 3)
            write_operators(path, {"alma": accounts["alma"]})  # vera left
            ended, seen = lines_until_the_end(lines, 40)  # 8 s of keep-alives
        assert ended, f"the stream ran on for {seen} keep-alives after vera was taken out"
        assert seen <= 10
        # Her browser's reconnect is refused, and so is a new request.
        assert client.get(url).status_code == 401


# ---- a person's chat session and its plans -------------------------------------------------------
def test_the_plans_of_another_person_s_chat_are_refused_as_the_chat_is(
    sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "operators"
    write_operators(path, {"vera": ("viewer", "vera-token"), "alma": ("approver", "alma-token")})
    settings = load_settings(
        database_url=sqlite_url,
        home=tmp_path,
        redis_url=None,
        operators=path,
        api_token="shared-token-1234",
        agent_internal_token="bridge-token-5678",
    )
    alma = {"Authorization": "Bearer alma-token"}
    vera = {"Authorization": "Bearer vera-token"}
    with TestClient(create_app(settings, keepalive_seconds=KEEPALIVE)) as client:
        chat = client.post(
            "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "mine"}, headers=alma
        )
        assert chat.status_code == 201, chat.text
        session_id = chat.json()["session_id"]
        plan = {
            "request_id": "r1",
            "title": "alma's own plan",
            "reason": "first",
            "nodes": [{"id": "a", "title": "private step", "actor": "agent", "status": "pending"}],
            "edges": [],
        }
        published = client.post(
            f"/api/v1/internal/sessions/{session_id}/execution-plans",
            json=plan,
            headers={"Authorization": "Bearer bridge-token-5678"},
        )
        assert published.status_code == 201, published.text
        routes = [
            f"/api/v1/sessions/{session_id}",
            f"/api/v1/sessions/{session_id}/execution-plans",
            f"/api/v1/sessions/{session_id}/execution-plans/1",
            f"/api/v1/agent/chat/session/{session_id}/stream",
        ]
        for route in routes:
            refused = client.get(route, headers=vera)
            assert refused.status_code == 403, (route, refused.text)
            assert refused.json()["error"]["code"] == "not_session_owner"
            assert "private step" not in refused.text
        for route in routes[:3]:  # the owner and the shared token read them
            assert client.get(route, headers=alma).status_code == 200, route
            shared = client.get(route, headers={"Authorization": "Bearer shared-token-1234"})
            assert shared.status_code == 200, route
        missing = client.get("/api/v1/sessions/no-such/execution-plans", headers=vera)
        assert missing.status_code == 404


@pytest.mark.parametrize("part", ["token%3D{}", "%74oken%3d{}", "token%3D{}%26x%3D1"])
def test_a_token_behind_an_encoded_equals_sign_is_kept_out_of_the_access_log(part: str) -> None:
    secret = "approver-token-3d0b"
    path = f"/console?a=1&{part.format(secret)}"
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", path, "1.1", 200), None,
    )  # fmt: skip
    assert _RedactToken().filter(record)
    assert secret not in record.getMessage()
    assert "/console?a=1&token=[redacted]" in record.getMessage()


def test_every_answer_is_data_never_sniffed_nor_cached(sqlite_url: str, tmp_path: Path) -> None:
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, api_token="tok-123456"
    )
    auth = {"Authorization": "Bearer tok-123456"}
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        task = client.post("/api/v1/tasks", json=TRIGGER, headers=auth).json()
        answers = {
            "read": client.get("/api/v1/tasks", headers=auth),
            # A 404's message repeats the id it was sent, markup included.
            "not found": client.get("/api/v1/tasks/<img src=x onerror=alert(1)>", headers=auth),
            "refused": client.get("/api/v1/tasks"),
            "too large": client.post(
                "/api/v1/tasks", content=b"x" * (settings.max_body_bytes + 1), headers=auth
            ),
        }
        for what, answer in answers.items():
            assert answer.headers["x-content-type-options"] == "nosniff", what
            assert answer.headers["cache-control"] == "no-store", what
        assert "<img src=x" in answers["not found"].json()["error"]["message"]
        # A stream keeps its own Cache-Control; the console's script keeps its no-cache.
        with client.stream("GET", f"/api/v1/tasks/{task['task_id']}/stream", headers=auth) as s:
            assert s.headers["cache-control"] == "no-cache"
            assert s.headers["x-content-type-options"] == "nosniff"
            client.post(f"/api/v1/tasks/{task['task_id']}/cancel", headers=auth)
        assert client.get("/console/app.js").headers["cache-control"] == "no-cache"


@pytest.mark.parametrize(
    "proxy",
    [{"X-Forwarded-Proto": "https"}, {"Forwarded": 'for=10.0.0.2;proto="https"'}],
    ids=["x-forwarded-proto", "forwarded"],
)
def test_the_console_cookie_is_secure_behind_a_proxy_that_ends_tls(
    sqlite_url: str, tmp_path: Path, proxy: dict[str, str]
) -> None:
    # The proxy runs in another container: uvicorn trusts its headers from 127.0.0.1 only, so
    # the request's scheme reads http though the browser sent it over HTTPS.
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, api_token="tok-123456"
    )
    with TestClient(create_app(settings)) as client:
        form = {"token": "tok-123456"}
        behind = client.post("/console/session", data=form, headers=proxy, follow_redirects=False)
        assert behind.status_code == 303
        assert "secure" in behind.headers["set-cookie"].lower().split("; ")
        by_url = client.get("/console?token=tok-123456", headers=proxy, follow_redirects=False)
        assert "secure" in by_url.headers["set-cookie"].lower().split("; ")
        # Plain HTTP on the machine itself (no proxy): a cookie the browser keeps.
        plain = client.post("/console/session", data=form, follow_redirects=False)
        assert "secure" not in plain.headers["set-cookie"].lower().split("; ")
