"""Wrong tokens per client address: a burst, then 429 `too_many_failures` with Retry-After.

Before, the API and the console's sign-in answered every wrong token with a 401 at once, so a
token could be guessed as fast as the network carried the guesses. The clock the limit drains
by is the test's, so the way out is checked without waiting.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path

import pytest
from fastapi import FastAPI

from orchestrator.api import console_session as session
from orchestrator.api import create_app
from orchestrator.api.sign_in_limit import (
    BURST,
    WIDE,
    FailedSignIns,
    TooManyFailures,
    client_address,
)
from orchestrator.settings import load_settings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKEN = "limit-shared-token"
VIEWER = "limit-viewer-token"
INTERNAL = "limit-internal-token"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def app(pg_url: str, tmp_path: Path) -> FastAPI:
    operators = tmp_path / "operators"
    digest = hashlib.sha256(VIEWER.encode()).hexdigest()
    operators.write_text(f"vera viewer {digest}\n", encoding="utf-8")
    settings = load_settings(
        database_url=pg_url,
        home=tmp_path,
        redis_url=None,
        api_token=TOKEN,
        operators=operators,
        agent_internal_token=INTERNAL,
    )
    application = create_app(settings)
    application.state.clock = Clock()
    limit = getattr(application.state, "sign_in_failures", None)  # none before the limit
    if limit is not None:
        limit.clock = application.state.clock
    return application


def client(app: FastAPI, address: str = "203.0.113.7") -> TestClient:
    return TestClient(app, raise_server_exceptions=False, client=(address, 40000))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_after_a_burst_of_wrong_tokens_even_the_right_one_waits_a_few_seconds(
    app: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    guesser, neighbour = client(app), client(app, "198.51.100.9")
    with guesser, neighbour, caplog.at_level(logging.WARNING):
        for n in range(BURST):
            assert guesser.get("/api/v1/tasks", headers=bearer(f"guess-{n}")).status_code == 401
        refused = guesser.get("/api/v1/tasks", headers=bearer(TOKEN))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_failures"
        wait = int(refused.headers["Retry-After"])
        assert 1 <= wait <= 6
        assert TOKEN not in refused.text
        assert all("guess-" not in r.getMessage() for r in caplog.records)
        # Another address is not held up, and the way out comes within Retry-After.
        assert neighbour.get("/api/v1/tasks", headers=bearer(TOKEN)).status_code == 200
        app.state.clock.now += wait
        assert guesser.get("/api/v1/tasks", headers=bearer(TOKEN)).status_code == 200
        # One more guess at once is refused again: the burst is spent, one a few seconds after.
        assert guesser.get("/api/v1/tasks", headers=bearer("x")).status_code == 401
        assert guesser.get("/api/v1/tasks", headers=bearer(TOKEN)).status_code == 429


def test_the_console_sign_in_counts_too_and_a_signed_in_browser_works_on(app: FastAPI) -> None:
    with client(app) as browser, client(app) as other_tab:
        other_tab.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
        assert other_tab.cookies.get(session.COOKIE)
        for n in range(BURST // 2):
            page = browser.post("/console/session", data={"token": f"g{n}"})
            assert page.status_code == 401
            assert browser.get(f"/console?token=h{n}").status_code == 401
        page = browser.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
        assert page.status_code == 429
        assert "Too many wrong tokens" in page.text
        assert TOKEN not in page.text
        assert int(page.headers["Retry-After"]) >= 1
        link = browser.get(f"/console?token={TOKEN}")
        assert (link.status_code, TOKEN in str(link.url)) == (429, False)
        assert "Too many wrong tokens" in link.text
        assert int(link.headers["Retry-After"]) >= 1
        # The API's bearer check shares the count; a session cookie is no guess and goes on.
        assert browser.get("/api/v1/tasks", headers=bearer(TOKEN)).status_code == 429
        assert other_tab.get("/api/v1/tasks").status_code == 200
        app.state.clock.now += int(page.headers["Retry-After"])
        answer = browser.post("/console/session", data={"token": TOKEN}, follow_redirects=False)
        assert answer.status_code == 303


def test_a_guess_beside_ones_own_cookie_and_at_the_bridge_counts(app: FastAPI) -> None:
    with client(app) as viewer:
        viewer.post("/console/session", data={"token": VIEWER}, follow_redirects=False)
        write = {"X-Orch-Console": "1"}
        for n in range(BURST // 2):
            # A right approver token would change the 403 into something else: an oracle.
            answer = viewer.delete("/api/v1/sessions/x", headers=write | bearer(f"g{n}"))
            assert answer.status_code == 403
            bridge = viewer.get("/api/v1/internal/sessions/x/execution-plans", headers=bearer("b"))
            assert bridge.status_code == 401
        blocked = viewer.delete("/api/v1/sessions/x", headers=write | bearer(TOKEN))
        assert blocked.status_code == 429
        assert viewer.get("/api/v1/tasks").status_code == 200  # the cookie alone


def test_the_addresses_remembered_are_bounded_and_ipv6_counts_by_its_64() -> None:
    failures = FailedSignIns(max_addresses=3, burst=2)
    for n in range(10):
        failures.failed(f"192.0.2.{n}")
    assert len(failures._levels) == 3
    one = client_address(("2001:db8:1:2:aaaa::1", 1))
    assert one == client_address(("2001:db8:1:2:bbbb::9", 1)) == "2001:db8:1:2::/64"
    assert client_address(("::ffff:192.0.2.1", 1)) == "192.0.2.1"
    assert client_address(None) == ""


def test_a_48_cycling_through_its_64s_is_held_up_too(caplog: pytest.LogCaptureFixture) -> None:
    """A home or a server is often given a /48 (65,536 /64s): each /64 had a burst of its own,
    and past the addresses remembered the least recently failed was forgotten, its burst whole
    again, so cycling through them guessed without limit. The /48 counts too, with WIDE times
    the burst and the rate."""
    clock = Clock()
    failures = FailedSignIns(max_addresses=50, clock=clock)
    guessed = 0
    with caplog.at_level(logging.WARNING):
        for n in range(BURST * WIDE + 100):
            address = client_address((f"2001:db8:7:{n % 200:x}::1", 1))  # 200 /64s, in turn
            try:
                failures.check(address)
            except TooManyFailures:
                continue
            failures.failed(address)
            guessed += 1
    assert guessed == BURST * WIDE
    assert "from 2001:db8:7::/48" in caplog.text
    # Another /48 is not held up; the /48's way out comes as its bucket drains.
    failures.check(client_address(("2001:db8:8::1", 1)))
    with pytest.raises(TooManyFailures) as refused:
        failures.check(client_address(("2001:db8:7:ffff::1", 1)))
    clock.now += refused.value.retry_after
    failures.check(client_address(("2001:db8:7:ffff::1", 1)))
