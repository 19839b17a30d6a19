"""The console's pages, its cookie session and ORCH_CORS_ORIGINS, through the real app."""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import console_session as session
from orchestrator.api import create_app
from orchestrator.api.console import _RedactToken
from orchestrator.operators import api_account
from orchestrator.settings import SettingsError, load_settings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKEN = "console-public-token"
ORIGIN = "http://localhost:5173"


def make_client(sqlite_url: str, tmp_path: Path, **overrides: Any) -> TestClient:
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path, redis_url=None, **({"api_token": TOKEN} | overrides)
    )
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture
def client(sqlite_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(sqlite_url, tmp_path, cors_origins=ORIGIN) as test_client:
        yield test_client


def sign_in(client: TestClient) -> str:
    answer = client.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
    assert answer.status_code == 303
    value = answer.cookies.get(session.COOKIE)
    assert value
    return str(value)


def test_without_a_session_the_console_is_the_sign_in_form(client: TestClient) -> None:
    page = client.get("/console")
    assert page.status_code == 200
    assert 'id="signin-form"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/console/session").json() == {
        "signed_in": False,
        "required": True,
        "account": None,
    }


def test_token_in_the_url_becomes_a_cookie_and_leaves_the_url(client: TestClient) -> None:
    answer = client.get(f"/console?token={TOKEN}&status=failed", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console?status=failed"
    set_cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in set_cookie
    assert "SameSite=strict" in set_cookie
    assert TOKEN not in set_cookie
    page = client.get("/console")  # the client keeps the cookie
    assert 'src="console/app.js"' in page.text
    assert TOKEN not in page.text
    assert client.get("/console/session").json() == {
        "signed_in": True,
        "required": True,
        "account": {"name": "api", "role": "approver", "shared": True},
    }


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_token_link_another_site_led_to_asks_before_signing_in(
    client: TestClient, site: str
) -> None:
    """Login CSRF by link: a page elsewhere linking `/console?token=<its account's token>`
    signed the person in as that account at once, and their decisions went under its name."""
    followed = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "navigate"}
    link = client.get(
        f"/console?token={TOKEN}&status=failed", headers=followed, follow_redirects=False
    )
    # The page asks at a URL without the token (a 5-minute ticket instead): the token does
    # not stay in the address bar and the tab's history while it asks.
    assert link.status_code == 303
    location = link.headers["location"]
    assert location.startswith("/console?status=failed&sign_in_ticket=")
    assert TOKEN not in location
    assert session.COOKIE not in link.headers.get("set-cookie", "")
    page = client.get(location, headers=followed, follow_redirects=False)
    assert page.status_code == 200
    assert session.COOKIE not in page.headers.get("set-cookie", "")
    assert "Sign in as api?" in page.text
    assert TOKEN not in page.text
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert client.get("/console/session").json()["signed_in"] is False
    # The person's click posts the page's ticket from the console's own origin.
    ticket = page.text.split('name="ticket" value="', 1)[1].split('"', 1)[0]
    own = {"Sec-Fetch-Site": "same-origin"}
    elsewhere = {"Sec-Fetch-Site": site}
    refused = client.post("/console/session", data={"ticket": ticket}, headers=elsewhere)
    assert refused.status_code == 403
    answer = client.post(
        "/console/session", data={"ticket": ticket}, headers=own, follow_redirects=False
    )
    assert answer.status_code == 303
    assert client.get("/console/session").json()["account"]["name"] == "api"
    # A ticket is no cookie, a cookie no ticket, and an old ticket is refused.
    client.cookies.clear()
    client.cookies.set(session.COOKIE, ticket)
    assert client.get("/api/v1/tasks").status_code == 401
    account = api_account(TOKEN)
    assert account is not None
    old = session.ticket(account, time.time() - session.TICKET_SECONDS - 1)
    for bad in (old, session.issue(account), ticket[:-1] + ("1" if ticket[-1] == "0" else "0")):
        stale = client.post("/console/session", data={"ticket": bad}, headers=own)
        assert stale.status_code == 401
        assert "expired" in stale.text
        asked = client.get("/console", params={"sign_in_ticket": bad}, headers=followed)
        assert (asked.status_code, "expired" in asked.text) == (401, True)


def test_the_access_log_never_shows_a_confirming_page_s_ticket() -> None:
    record = access_line("/console?a=1&sign_in_ticket=t1.YXBp.1.abc")
    assert _RedactToken().filter(record)
    assert "YXBp" not in record.getMessage()
    assert "/console?a=1&sign_in_ticket=[redacted]" in record.getMessage()


def test_a_token_link_typed_or_opened_from_another_program_signs_in_at_once(
    client: TestClient,
) -> None:
    for fetch_site in ("none", "same-origin"):
        answer = client.get(
            f"/console?token={TOKEN}",
            headers={"Sec-Fetch-Site": fetch_site},
            follow_redirects=False,
        )
        assert answer.status_code == 303


def test_a_second_console_cookie_a_sibling_host_tossed_in_is_no_session(
    client: TestClient,
) -> None:
    """Cookie tossing: wiki.example.com sets `orch_console=<its own account's session>;
    Domain=example.com; Path=/api`, which the browser sends before the person's own; the API
    took the first, and the person acted as the tosser's account."""
    tossed, own = sign_in(client), sign_in(client)
    client.cookies.clear()
    both = {"Cookie": f"{session.COOKIE}={tossed}; {session.COOKIE}={own}"}
    assert client.get("/api/v1/tasks", headers=both).status_code == 401
    assert client.get("/console/session", headers=both).json()["signed_in"] is False
    assert (
        client.get("/api/v1/tasks", headers={"Cookie": f"{session.COOKIE}={own}"}).status_code
        == 200
    )


def test_a_wrong_token_is_refused_without_echoing_it(client: TestClient) -> None:
    answer = client.post("/console/session", data={"token": "<b>guess</b>"})
    assert answer.status_code == 401
    assert "That token is not accepted." in answer.text
    assert "guess" not in answer.text
    assert session.COOKIE not in answer.headers.get("set-cookie", "")
    link = client.get("/console?token=nope&status=failed", follow_redirects=False)
    # A refused link leaves no token in the address bar: the form, at a URL without it.
    assert (link.status_code, link.headers["location"]) == (
        303,
        "/console?status=failed&sign_in_refused=token",
    )
    form = client.get(link.headers["location"])
    assert (form.status_code, "That token is not accepted." in form.text) == (401, True)


def test_the_cookie_authenticates_reads_and_writes_with_the_console_header(
    client: TestClient,
) -> None:
    assert client.get("/api/v1/tasks").status_code == 401
    sign_in(client)
    assert client.get("/api/v1/tasks").status_code == 200
    body = {"reason": "stop"}
    # A write by cookie alone could come from a cross-site form: it needs the console's header.
    assert client.post("/api/v1/tasks/nope/cancel", json=body).status_code == 401
    answer = client.post("/api/v1/tasks/nope/cancel", json=body, headers={"X-Orch-Console": "1"})
    assert answer.status_code == 404
    # The internal bridge never takes the cookie.
    assert client.get("/api/v1/internal/sessions/x/execution-plans").status_code == 401


def test_sign_out_clears_the_cookie(client: TestClient) -> None:
    sign_in(client)
    answer = client.post("/console/signout", follow_redirects=False)
    assert answer.status_code == 303
    assert f'{session.COOKIE}=""' in answer.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/api/v1/tasks").status_code == 401


def test_a_cookie_signed_before_the_token_changed_is_refused(
    client: TestClient, sqlite_url: str, tmp_path: Path
) -> None:
    value = sign_in(client)
    with make_client(sqlite_url, tmp_path, api_token="the-new-token") as rotated:
        rotated.cookies.set(session.COOKIE, value)
        assert rotated.get("/api/v1/tasks").status_code == 401
        assert 'id="signin-form"' in rotated.get("/console").text


#: What a module imports: `import { ... } from "./name.js";` (the console's own, by relative path).
_IMPORT = re.compile(r'^import [^;]* from "\./([a-z_]+\.js)";$', re.MULTILINE)


def test_static_files_are_served_and_nothing_else(client: TestClient) -> None:
    # The page's script is app.js, a module; every module it imports, and theirs, is served.
    seen: set[str] = set()
    wanted = ["app.js"]
    while wanted:
        name = wanted.pop()
        script = client.get(f"/console/{name}")
        assert script.status_code == 200, name
        # A module script of another type is refused by the browser (strict MIME checking).
        assert script.headers["content-type"].startswith("text/javascript"), name
        assert script.headers["cache-control"] == "no-cache", name
        assert script.headers["x-content-type-options"] == "nosniff", name
        assert "innerHTML" not in script.text, name
        # One job each, none past the 800 lines of STYLE.md (app.js alone was 2,150).
        assert len(script.text.splitlines()) < 800, name
        seen.add(name)
        wanted += [found for found in _IMPORT.findall(script.text) if found not in seen]
    assert len(seen) > 1  # app.js imports the others
    # Every script of the folder is one the console loads (none left unserved or unused).
    folder = Path(__file__).resolve().parents[2] / "orchestrator" / "console"
    assert seen | {"signin.js"} == {path.name for path in folder.glob("*.js")}
    assert client.get("/console/style.css").status_code == 200
    assert client.get("/console/index.html").status_code == 404
    assert client.get("/console/..%2Fsettings.py").status_code == 404


def test_preflight_is_answered_for_a_listed_origin(client: TestClient) -> None:
    preflight = client.options(
        "/api/v1/agent/chat/session/x/stream",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization,last-event-id",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert preflight.headers["access-control-allow-credentials"] == "true"
    refused = client.get("/api/v1/tasks", headers={"Origin": ORIGIN})
    assert refused.status_code == 401  # CORS headers or not, the token is still needed
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    listed = client.get(
        "/api/v1/tasks", headers={"Origin": ORIGIN, "Authorization": f"Bearer {TOKEN}"}
    )
    assert listed.status_code == 200
    stream = client.get(
        "/api/v1/agent/chat/session/nope/stream",
        headers={"Origin": ORIGIN, "Authorization": f"Bearer {TOKEN}"},
    )
    assert stream.status_code == 404  # an unknown session, answered with the CORS headers
    assert stream.headers["access-control-allow-origin"] == ORIGIN
    other = client.get(
        "/api/v1/tasks", headers={"Origin": "http://evil.test", "Authorization": f"Bearer {TOKEN}"}
    )
    assert "access-control-allow-origin" not in other.headers


def test_without_cors_origins_nothing_changes(sqlite_url: str, tmp_path: Path) -> None:
    with make_client(sqlite_url, tmp_path) as plain:
        answer = plain.options(
            "/api/v1/tasks", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
        )
        assert answer.status_code == 401
        assert "access-control-allow-origin" not in answer.headers


def test_an_open_api_serves_the_console_without_sign_in(sqlite_url: str, tmp_path: Path) -> None:
    with make_client(sqlite_url, tmp_path, api_token=None) as open_client:
        assert 'src="console/app.js"' in open_client.get("/console").text
        assert open_client.get("/console/session").json() == {
            "signed_in": True,
            "required": False,
            "account": {"name": "anonymous", "role": "approver", "shared": True},
        }
        moved = open_client.get("/console?token=x", follow_redirects=False)
        assert moved.headers["location"] == "/console"
        # The sign-in form's POST (a page left open from before the token was unset) too.
        posted = open_client.post(
            "/console/session",
            content="token=x",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
        assert (posted.status_code, posted.headers["location"]) == (303, "/console")
        assert "set-cookie" not in posted.headers


@pytest.mark.parametrize("value", ["*", "http://a.test/path", "ftp://a.test", "a.test"])
def test_bad_cors_origins_are_one_line(value: str) -> None:
    with pytest.raises(SettingsError, match="ORCH_CORS_ORIGINS"):
        load_settings(cors_origins=value)


def access_line(path: str) -> logging.LogRecord:
    """The record uvicorn's access logger makes for a GET of `path` answered 303."""
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", path, "1.1", 303), None,
    )  # fmt: skip


def test_the_access_log_never_shows_the_token() -> None:
    record = access_line(f"/console?a=1&token={TOKEN}")
    assert _RedactToken().filter(record)
    assert TOKEN not in record.getMessage()
    assert "/console?a=1&token=[redacted]" in record.getMessage()


@pytest.mark.parametrize("key", ["%74oken", "tok%65n", "%74%6F%6B%65%6E"])
def test_the_access_log_never_shows_a_percent_encoded_token(client: TestClient, key: str) -> None:
    # The console decodes the query's names, so an encoded `token` signs in like the plain one.
    answer = client.get(f"/console?a=1&{key}={TOKEN}", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.cookies.get(session.COOKIE)
    record = access_line(f"/console?a=1&{key}={TOKEN}")
    assert _RedactToken().filter(record)
    assert TOKEN not in record.getMessage()
    assert "/console?a=1&token=[redacted]" in record.getMessage()


def test_a_sign_in_form_sent_without_a_length_is_read_up_to_its_bound(
    client: TestClient,
) -> None:
    """A form sent chunked (no Content-Length) was told "The form is too large" whatever its
    size; it is read up to the bound, and only one past it is refused."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def chunked(body: bytes) -> Iterator[bytes]:
        yield from (body[i : i + 1000] for i in range(0, len(body), 1000))

    answer = client.post(
        "/console/session",
        content=chunked(f"token={TOKEN}".encode()),
        headers=form,
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    assert session.COOKIE in answer.headers["set-cookie"]
    huge = client.post("/console/session", content=chunked(b"token=" + b"x" * 9000), headers=form)
    assert huge.status_code == 413
    assert "The form is too large." in huge.text


def test_a_script_the_browser_holds_is_answered_304(client: TestClient) -> None:
    """The console's fourteen modules are `no-cache`: the browser asks for each at every
    load, and each was sent whole every time (`FileResponse` answers no conditional request).
    One it holds unchanged is answered `304`, with no body and the same headers."""
    first = client.get("/console/app.js")
    tag = first.headers["etag"]
    again = client.get("/console/app.js", headers={"If-None-Match": tag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == tag
    assert again.headers["cache-control"] == "no-cache"
    assert again.headers["x-content-type-options"] == "nosniff"
    # A weak form of the tag, or one among others, is the same; another tag is not.
    assert (
        client.get("/console/app.js", headers={"If-None-Match": f'"x", W/{tag}'}).status_code == 304
    )
    other = client.get("/console/app.js", headers={"If-None-Match": '"another"'})
    assert (other.status_code, other.text) == (200, first.text)
    # Each file has its own tag: a module's is not another's.
    assert client.get("/console/api.js", headers={"If-None-Match": tag}).status_code == 200
