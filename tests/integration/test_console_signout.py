"""Signing out of the console ends the session, not only the browser's copy of its cookie.

The cookie is signed, not stored: before, sign-out cleared it in the browser and a copy (a
shared machine, a proxy's log, the developer tools) stayed good for the rest of its 12 hours,
on every API process. Now the session's nonce is recorded until the cookie would expire.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from orchestrator.api import console_session as session
from orchestrator.api import create_app
from orchestrator.api.signouts import REFRESH_SECONDS, SignOuts
from orchestrator.operators import Operator, api_account
from orchestrator.settings import load_settings
from orchestrator.store import Database
from orchestrator.store.console_signouts import PER_ACCOUNT
from orchestrator.store.tables import console_signouts

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKEN = "console-signout-token"
CONSOLE = {"X-Orch-Console": "1"}


def make_client(store_url: str, tmp_path: Path) -> TestClient:
    settings = load_settings(database_url=store_url, home=tmp_path, api_token=TOKEN)
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture
def replicas(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    """Two API processes on one store, as behind a load balancer."""
    with make_client(store_url, tmp_path) as one, make_client(store_url, tmp_path) as two:
        yield one, two


def a_session(nonce: str, expires: float, name: str = "api") -> session.Session:
    return session.Session(Operator(name, "approver", shared=True), nonce, int(expires))


def sign_in(client: TestClient) -> str:
    answer = client.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    # httpx keeps the answer's cookie beside one set by hand later, and two console cookies
    # are no session (a sibling host's tossed cookie): the tests set the one they mean.
    client.cookies.clear()
    return str(answer.cookies[session.COOKIE])


def test_a_copy_of_a_signed_out_cookie_is_refused_here_and_on_every_replica(
    replicas: tuple[TestClient, TestClient],
) -> None:
    one, two = replicas
    copied = sign_in(one)
    other_browser = sign_in(one)  # the same account in another browser stays signed in
    for replica in (one, two):
        replica.cookies.set(session.COOKIE, copied)
        assert replica.get("/api/v1/tasks").status_code == 200
    assert one.post("/console/signout", follow_redirects=False).status_code == 303
    # The process that signed it out refuses the copy at once: reads, writes, pages, streams.
    one.cookies.set(session.COOKIE, copied)
    assert one.get("/api/v1/tasks").status_code == 401
    assert one.post("/api/v1/tasks/x/cancel", json={}, headers=CONSOLE).status_code == 401
    assert one.get("/console/session").json()["signed_in"] is False
    assert 'id="signin-form"' in one.get("/console").text
    # Another process learns of it within its refresh.
    deadline = time.monotonic() + REFRESH_SECONDS + 3
    while two.get("/api/v1/tasks").status_code == 200:
        assert time.monotonic() < deadline, "the other replica still accepts the copy"
        time.sleep(0.1)
    assert two.get("/api/v1/tasks").status_code == 401
    # Only that session ended.
    one.cookies.set(session.COOKIE, other_browser)
    assert one.get("/api/v1/tasks").status_code == 200


def test_a_restarted_api_still_refuses_it_and_signing_out_twice_records_it_once(
    store_url: str, tmp_path: Path
) -> None:
    with make_client(store_url, tmp_path) as first:
        copied = sign_in(first)
        for _ in range(2):  # two tabs
            first.cookies.set(session.COOKIE, copied)
            assert first.post("/console/signout", follow_redirects=False).status_code == 303
    with make_client(store_url, tmp_path) as restarted:
        restarted.cookies.set(session.COOKIE, copied)
        deadline = time.monotonic() + 5
        while restarted.get("/api/v1/tasks").status_code == 200:
            assert time.monotonic() < deadline, "a restarted API accepts a signed-out session"
            time.sleep(0.05)
    db = Database.from_url(store_url)
    try:
        with db.transaction(readonly=True) as conn:
            rows = conn.execute(select(func.count()).select_from(console_signouts)).scalar_one()
    finally:
        db.dispose()
    assert rows == 1


def test_a_store_that_cannot_be_read_keeps_the_known_sign_outs(store_url: str) -> None:
    db = Database.from_url(store_url)
    try:
        signouts = SignOuts(db)
        kept = a_session("n0nce", time.time() + 60)
        gone = a_session("gone", time.time() - 1)  # its cookie expired: refused for age
        signouts.sign_out(kept)
        signouts.sign_out(gone)
        other = SignOuts(db)
        other.refresh()
        assert other.revoked(kept)
        assert not other.revoked(gone)
        db.dispose()
        broken = Database.from_url("postgresql+psycopg://nobody@127.0.0.1:1/none")
        other.db = broken
        other.refresh()  # logged, not raised
        assert other.revoked(kept)
        broken.dispose()
    finally:
        db.dispose()


def test_a_sign_in_or_sign_out_form_posted_from_another_site_is_refused(
    store_url: str, tmp_path: Path
) -> None:
    """Login CSRF: another site's page posting its own account's token into the console would
    sign the person in as that account, and their approvals would be recorded under it."""
    cross = {"Sec-Fetch-Site": "cross-site"}
    with make_client(store_url, tmp_path) as client:
        answer = client.post(
            "/console/session", data={"token": TOKEN}, headers=cross, follow_redirects=False
        )
        assert answer.status_code == 403
        assert "from another site is refused" in answer.text
        assert session.COOKIE not in answer.headers.get("set-cookie", "")
        own = {"Sec-Fetch-Site": "same-origin"}
        value = sign_in(client)
        refused = client.post("/console/signout", headers=cross, follow_redirects=False)
        assert refused.status_code == 403
        client.cookies.set(session.COOKIE, value)
        assert client.get("/api/v1/tasks").status_code == 200
        done = client.post("/console/signout", headers=own, follow_redirects=False)
        assert done.status_code == 303


def test_a_starting_api_refuses_a_signed_out_session_from_its_first_answer(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that starts (a restart, a rolling deploy, one more behind the balancer) knows
    the sign-outs before it answers: its refresher thread may not have read them yet (here it
    never does), and until then a copy of a signed-out cookie was accepted."""
    with make_client(store_url, tmp_path) as first:
        copied = sign_in(first)
        first.cookies.set(session.COOKIE, copied)
        assert first.post("/console/signout", follow_redirects=False).status_code == 303
    monkeypatch.setattr(SignOuts, "_run", lambda self: None)  # a refresher slow to start
    with make_client(store_url, tmp_path) as starting:
        starting.cookies.set(session.COOKIE, copied)
        assert starting.get("/api/v1/tasks").status_code == 401
        assert starting.get("/console/session").json()["signed_in"] is False


def test_a_sign_in_or_sign_out_form_posted_from_a_sibling_site_is_refused_too(
    store_url: str, tmp_path: Path
) -> None:
    """Another host of the same site (wiki.example.com beside orch.example.com) is not the
    console either: `Sec-Fetch-Site: same-site` posting its own token signed the person in as
    its account, and posting a sign-out ended the session (SameSite sends the cookie there)."""
    sibling = {"Sec-Fetch-Site": "same-site"}
    with make_client(store_url, tmp_path) as client:
        answer = client.post(
            "/console/session", data={"token": TOKEN}, headers=sibling, follow_redirects=False
        )
        assert answer.status_code == 403
        assert session.COOKIE not in answer.headers.get("set-cookie", "")
        value = sign_in(client)
        refused = client.post("/console/signout", headers=sibling, follow_redirects=False)
        assert refused.status_code == 403
        client.cookies.set(session.COOKIE, value)
        assert client.get("/api/v1/tasks").status_code == 200


def test_signing_in_and_out_in_a_loop_keeps_a_bounded_store_and_every_copy_out(
    replicas: tuple[TestClient, TestClient], store_url: str
) -> None:
    """Before, each sign-out kept its nonce for 12 hours and every API process read them all
    every 2 seconds: an account looping sign-in and sign-out grew both without bound."""
    one, two = replicas
    copies = []
    for _ in range(PER_ACCOUNT + 10):
        copies.append(sign_in(one))
        one.cookies.set(session.COOKIE, copies[-1])
        assert one.post("/console/signout", follow_redirects=False).status_code == 303
    db = Database.from_url(store_url)
    try:
        with db.transaction(readonly=True) as conn:
            rows = conn.execute(text("SELECT count(*) FROM console_signouts")).scalar_one()
    finally:
        db.dispose()
    assert rows <= PER_ACCOUNT
    # Every copy of the loop's cookies stays out, here and on the other replica; a browser
    # signed in afterwards is not.
    later = session.issue(api_account(TOKEN), time.time() + 2)  # type: ignore[arg-type]
    two.app.state.signouts.refresh()
    for replica in (one, two):
        for copy in copies:
            replica.cookies.set(session.COOKIE, copy)
            assert replica.get("/api/v1/tasks").status_code == 401
        replica.cookies.set(session.COOKIE, later)
        assert replica.get("/api/v1/tasks").status_code == 200
