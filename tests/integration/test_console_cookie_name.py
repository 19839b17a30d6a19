"""Over HTTPS the console's session cookie is `__Host-orch_console`; over plain HTTP `orch_console`.

A browser keeps a `__Host-` cookie only when it is Secure, at `Path=/` and without `Domain`,
and set over HTTPS: a sibling host of the site (wiki.example.com beside orch.example.com) or a
page over plain HTTP cannot set one of that name, so cookie tossing has nothing to offer. The
name the cookie was read by follows how the request arrived (directly over HTTPS, or through a
proxy that ends TLS and says so), and a cookie of the other name is no session.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from orchestrator.api import console_session as session
from orchestrator.api import create_app
from orchestrator.settings import load_settings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKEN = "cookie-name-token-41d2"
SECURE = "__Host-orch_console"
PLAIN = "orch_console"

#: How a request reached the API over HTTPS: directly, or through a proxy that ends TLS (in
#: another container: uvicorn trusts its headers from 127.0.0.1 only, so the scheme reads http).
ARRIVALS = {
    "tls": ("https://testserver", {}),
    "x-forwarded-proto": ("http://testserver", {"X-Forwarded-Proto": "https"}),
    "forwarded": ("http://testserver", {"Forwarded": 'for=10.0.0.2;proto="https"'}),
}


@pytest.fixture
def app(sqlite_url: str, tmp_path: Path) -> FastAPI:
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, api_token=TOKEN
    )
    return create_app(settings)


@pytest.fixture(params=list(ARRIVALS))
def https(request: pytest.FixtureRequest, app: FastAPI) -> Iterator[TestClient]:
    base_url, headers = ARRIVALS[request.param]
    with TestClient(app, base_url=base_url, headers=headers) as client:
        yield client


def attributes(set_cookie: str) -> tuple[str, set[str]]:
    """A Set-Cookie header's name and its attributes, lower-cased (`secure`, `path=/`, ...)."""
    first, *rest = (part.strip() for part in set_cookie.split(";"))
    return first.partition("=")[0], {part.lower() for part in rest}


def signed_in(client: TestClient, **headers: str) -> tuple[str, str]:
    """Sign in by the form: (the cookie's name, its value)."""
    answer = client.post(
        "/console/session", data={"token": TOKEN}, headers=headers, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    name, _, rest = answer.headers["set-cookie"].partition("=")
    return name, rest.partition(";")[0]


def test_over_https_the_cookie_is_a_host_cookie_and_signs_the_browser_in(
    https: TestClient,
) -> None:
    answer = https.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
    assert answer.status_code == 303
    cookies = answer.headers.get_list("set-cookie")
    assert len(cookies) == 1, cookies
    name, flags = attributes(cookies[0])
    assert name == SECURE
    assert {"secure", "httponly", "path=/", "samesite=strict"} <= flags
    assert not any(flag.startswith("domain") for flag in flags)
    link = https.get(f"/console?token={TOKEN}", follow_redirects=False)
    assert attributes(link.headers["set-cookie"])[0] == SECURE
    value = answer.headers["set-cookie"].partition("=")[2].partition(";")[0]

    https.cookies.clear()
    own = {"Cookie": f"{SECURE}={value}"}
    assert https.get("/api/v1/tasks", headers=own).status_code == 200
    assert https.get("/console/session", headers=own).json()["signed_in"] is True
    write = https.post("/api/v1/tasks/nope/cancel", json={}, headers=own | {"X-Orch-Console": "1"})
    assert write.status_code == 404  # past the token check: the task is not found
    # The same value under the plain name, which a sibling host or plain HTTP can set: nothing.
    plain = {"Cookie": f"{PLAIN}={value}"}
    assert https.get("/api/v1/tasks", headers=plain).status_code == 401
    assert https.get("/console/session", headers=plain).json()["signed_in"] is False
    # A session a sibling host tossed in under the plain name is ignored beside the person's
    # own (it was refused as two cookies of one name, the person then signed in as no one).
    tossed = {"Cookie": f"{PLAIN}={value}; {SECURE}={value}"}
    assert https.get("/api/v1/tasks", headers=tossed).status_code == 200


def test_sign_out_over_https_clears_the_host_cookie(https: TestClient) -> None:
    signed_in(https)
    answer = https.post("/console/signout", follow_redirects=False)
    assert answer.status_code == 303
    name, flags = attributes(answer.headers["set-cookie"])
    # A browser refuses a `__Host-` cookie without Secure, its clearing one included.
    assert name == SECURE
    assert {"secure", "path=/", "max-age=0"} <= flags
    assert https.get("/api/v1/tasks").status_code == 401


def test_over_plain_http_the_cookie_keeps_its_name_and_a_host_cookie_is_no_session(
    app: FastAPI,
) -> None:
    """Loopback development: `orch_console`, not Secure (a browser would not keep a Secure
    cookie set over plain HTTP); a `__Host-` cookie sent that way is no session."""
    with TestClient(app) as plain, TestClient(app, base_url="https://testserver") as tls:
        answer = plain.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
        name, flags = attributes(answer.headers["set-cookie"])
        assert name == PLAIN == session.COOKIE
        assert "secure" not in flags
        value = answer.headers["set-cookie"].partition("=")[2].partition(";")[0]
        _, secure_value = signed_in(tls)
        plain.cookies.clear()
        own = {"Cookie": f"{PLAIN}={value}"}
        assert plain.get("/api/v1/tasks", headers=own).status_code == 200
        other = {"Cookie": f"{SECURE}={secure_value}"}
        assert plain.get("/api/v1/tasks", headers=other).status_code == 401
        assert plain.get("/console/session", headers=other).json()["signed_in"] is False
        out = plain.post("/console/signout", headers=own, follow_redirects=False)
        assert attributes(out.headers["set-cookie"])[0] == PLAIN
