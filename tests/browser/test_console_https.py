"""The console over HTTPS in a real headless chromium: its session cookie is a `__Host-` cookie
the browser keeps, sends back and clears, and a cookie of the plain name beside it is ignored.

`orchestrator api` serves plain HTTP (TLS ends at a proxy in production), so the API runs here
in uvicorn with a certificate of a throwaway authority (trustme), in this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvicorn
from playwright.sync_api import expect

from orchestrator.api import create_app
from orchestrator.settings import load_settings
from tests.browser.conftest import TOKEN
from tests.services import bound_socket

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def https_url(sqlite_url: str, tmp_path: Path) -> Iterator[str]:
    settings = load_settings(
        database_url=sqlite_url, home=tmp_path / "home", redis_url=None, api_token=TOKEN
    )
    pem = tmp_path / "server.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    sock = bound_socket()  # its port cannot be taken by another process before uvicorn listens
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        ssl_certfile=str(pem),
        ssl_keyfile=str(pem),
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"https://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)
    sock.close()


def test_signed_in_over_https_the_browser_holds_a_host_cookie(browser: Any, https_url: str) -> None:
    context = browser.new_context(ignore_https_errors=True)
    tab = context.new_page()
    try:
        tab.goto(f"{https_url}/console")
        tab.fill("#token", TOKEN)
        tab.click("#signin-form button")
        expect(tab.locator("h1")).to_have_text("Tasks")  # its reads went with the cookie
        (cookie,) = context.cookies()
        assert cookie["name"] == "__Host-orch_console"
        assert (cookie["secure"], cookie["httpOnly"], cookie["path"]) == (True, True, "/")
        assert cookie["sameSite"] == "Strict"
        # A session under the plain name (as a sibling host of the site could set) is ignored
        # beside it: the page still reads as the person's own.
        context.add_cookies([{**cookie, "name": "orch_console", "path": "/api"}])
        tab.reload()
        expect(tab.locator("h1")).to_have_text("Tasks")
        tab.click("#signout button")
        expect(tab.locator("#signin-form")).to_be_visible()
        # The clearing cookie was taken (a `__Host-` one without Secure would not be).
        assert [c["name"] for c in context.cookies()] == ["orch_console"]
    finally:
        context.close()
