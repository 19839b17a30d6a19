"""A task page's live marker against an API that stops answering (its process stopped with
SIGSTOP: the connections stay open, nothing comes), in a real headless chromium against a real
API, worker and sweeper whose streams keep alive every 2 s.

Before, the stream's keep-alive was an SSE comment, which an `EventSource` never surfaces: the
page could not tell a quiet stream from a dead one and kept "live" lit for as long as the API
hung. And the page's probe of the task stream had no timeout: a hung API got a new probe at
every 3-s poll, all of them left waiting."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console, running_console, shot
from tests.browser.pages import open_task
from tests.services import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

KEEPALIVE = 2.0
#: The page gives a stream 2.5 keep-alive intervals of silence.
QUIET = 2.5 * KEEPALIVE
PAUSED = re.compile(r"^live updates paused: nothing from the API in (\d+) s; reconnecting$")


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, browser: Any, redis_server: RedisServer
) -> Iterator[Console]:
    with running_console(
        tmp_path_factory.mktemp("liveness"),
        redis_server,
        ORCH_STREAM_KEEPALIVE_SECONDS=str(KEEPALIVE),
    ) as server:
        yield server


#: Every text the live marker shows, in order (`window.__marks`).
_MARKS = """
() => {
  window.__marks = [];
  new MutationObserver(() => {
    const live = document.getElementById("live");
    const text = live ? live.textContent : null;
    const marks = window.__marks;
    if (text !== null && marks[marks.length - 1] !== text) marks.push(text);
  }).observe(document, { subtree: true, childList: true, characterData: true });
}
"""

#: The page's probes of the task stream (`fetch`, not the `EventSource`): how many were sent,
#: how many are on their way now, the most at once (`window.__probes`).
_PROBES = """
(path) => {
  const real = window.fetch.bind(window);
  window.__probes = { sent: 0, now: 0, most: 0 };
  window.fetch = (input, init) => {
    const url = new URL(String(input), location.href);
    if (url.pathname !== path) return real(input, init);
    const p = window.__probes;
    p.sent += 1; p.now += 1; p.most = Math.max(p.most, p.now);
    const done = () => { p.now -= 1; };
    return real(input, init).then((r) => { done(); return r; }, (e) => { done(); throw e; });
  };
}
"""


def _waiting_task(console: Console, title: str) -> str:
    """A task that waits for an approval: its stream stays open and quiet."""
    task_id = console.trigger("approval", title)
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    return task_id


def test_a_hung_api_is_not_shown_live_and_is_again_once_it_answers(
    page: Any, console: Console
) -> None:
    task_id = _waiting_task(console, "Followed while the API hangs")
    page.goto("about:blank")
    page.add_init_script(f"({_MARKS})()")
    open_task(page, console, task_id)
    live = page.locator("#live")
    expect(live).to_have_text("live")
    # A quiet stream that keeps alive stays live, past the silence the page allows.
    time.sleep(QUIET + KEEPALIVE)
    assert page.evaluate("() => window.__marks").count("live") == 1, page.evaluate(
        "() => window.__marks"
    )
    assert console.process is not None
    os.kill(console.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        expect(live).to_have_text(PAUSED, timeout=20_000)
        paused_after = time.monotonic() - stopped
        expect(live).to_have_class(re.compile(r"\boff\b"))
        shot(page, "stream-paused")
        said = PAUSED.match(live.inner_text())
        assert said is not None
        # Counted from the last thing heard: at least the silence allowed, less a keep-alive.
        assert int(said.group(1)) >= QUIET - KEEPALIVE, said.group(0)
        # Within 2.5 intervals of the last keep-alive before the stop (give timers 3 s).
        assert paused_after < QUIET + 3, paused_after
    finally:
        os.kill(console.process.pid, signal.SIGCONT)
    resumed = time.monotonic()
    expect(live).to_have_text("live", timeout=20_000)
    back = time.monotonic() - resumed
    print(f"paused {paused_after:.1f} s after SIGSTOP, live {back:.1f} s after SIGCONT")
    expect(live).to_have_class(re.compile(r"\bon\b"))


def test_a_hung_api_gets_one_probe_of_its_stream_at_a_time(page: Any, console: Console) -> None:
    """The API stops as the page's first probe of the task stream goes out, so every later
    probe meets a hung API too: the 3-s poll asks again only once the one on its way gave up
    (after 10 s, as any read)."""
    task_id = _waiting_task(console, "Probed while the API hangs")
    path = f"/api/v1/tasks/{task_id}/stream"
    assert console.process is not None
    pid = console.process.pid
    stopped: list[float] = []

    def stop_as_the_probe_goes(route: Any) -> None:
        if route.request.resource_type == "fetch" and not stopped:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(time.monotonic())
        route.continue_()

    page.goto("about:blank")
    page.add_init_script(f"({_PROBES})({path!r})")
    page.route(f"**{path}", stop_as_the_probe_goes)
    try:
        page.goto(f"{console.url}/console#/task/{task_id}")
        expect(page.locator("#task-title")).to_be_visible()
        page.wait_for_function("() => window.__probes.sent >= 1")
        assert stopped
        # Five polls meet the hung API, and the first probe's 10 s run out.
        while time.monotonic() - stopped[0] < 14:
            page.wait_for_timeout(500)
        probes = page.evaluate("() => window.__probes")
        shot(page, "stream-probes-hung")
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
    assert probes["most"] == 1, probes
    assert 2 <= probes["sent"] <= 3, probes  # the first, given up, and the next poll's
    page.unroute(f"**{path}")
    expect(page.locator("#live")).to_have_text("live", timeout=20_000)
