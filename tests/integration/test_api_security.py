"""The API as an attacker meets it: credentials that are no credentials, and (without a token)
pages of other sites reaching the loopback API."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import console_session as session
from orchestrator.api import create_app
from orchestrator.settings import load_settings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

#: The hash `printf %s "$TOKEN" | sha256sum` prints when $TOKEN is unset: the empty string's.
EMPTY_HASH = hashlib.sha256(b"").hexdigest()


def make_client(sqlite_url: str, tmp_path: Path, **overrides: Any) -> TestClient:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, redis_url=None, **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture
def empty_hash_account(sqlite_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """An operators file whose approver was given the empty string's hash by mistake."""
    path = tmp_path / "operators"
    good = hashlib.sha256(b"vera-token").hexdigest()
    path.write_text(f"vera viewer {good}\neve approver {EMPTY_HASH}\n", encoding="utf-8")
    with make_client(sqlite_url, tmp_path, operators=path) as client:
        yield client


@pytest.mark.parametrize("header", ["Bearer ", "Bearer", "Bearer    ", "bearer \t"])
def test_an_empty_bearer_token_names_no_account(
    empty_hash_account: TestClient, header: str
) -> None:
    answer = empty_hash_account.get("/api/v1/actions", headers={"Authorization": header})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthorized"
    # The file's accounts still work.
    ok = empty_hash_account.get("/api/v1/actions", headers={"Authorization": "Bearer vera-token"})
    assert ok.status_code == 200, ok.text


def test_an_empty_token_signs_no_one_in_to_the_console(empty_hash_account: TestClient) -> None:
    by_form = empty_hash_account.post(
        "/console/session", data={"token": ""}, follow_redirects=False
    )
    assert by_form.status_code == 401
    assert "That token is not accepted." in by_form.text
    by_url = empty_hash_account.get("/console?token=", follow_redirects=False)
    assert by_url.status_code == 401
    for answer in (by_form, by_url):
        assert session.COOKIE not in answer.headers.get("set-cookie", "")
    assert empty_hash_account.get("/console/session").json()["signed_in"] is False
