"""The plan graph in a real headless chromium against a real API, worker and sweeper (seed
004: the trunk and its parallel branches, at 320 and 375 px, zoomed, and on a desktop page).

A DAG layer is one row however many branches it holds: wrapped onto a second row, a branch
sat under its siblings, the edges to it and past it ran behind other nodes, and the graph read
as a chain that is not in the plan. A layer wider than the card scrolls inside the graph, and
every edge still ends on its own nodes, scrolled or not. An edge's condition sits beside the
straight end of its line, clear of every line, node and other label.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import TOKEN, Console, shot
from tests.browser.scripts import CONDITION, LONG_LABEL

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@contextmanager
def task_tab(
    browser: Any, console: Console, task_id: str, width: int, height: int, scale: int = 1
) -> Iterator[Any]:
    """A signed-in tab, in a browser context of its own viewport, on the task's page."""
    context = browser.new_context(
        viewport={"width": width, "height": height}, device_scale_factor=scale
    )
    tab = context.new_page()
    try:
        tab.goto(f"{console.url}/console?token={TOKEN}")
        tab.goto(f"{console.url}/console#/task/{task_id}")
        yield tab
    finally:
        context.close()


#: Per layer, the distinct tops of its nodes (one row: one top).
ROWS = """() => [...document.querySelectorAll('ol.layers > li')].map((li) => new Set(
  [...li.querySelectorAll('button.node')].map((b) => Math.round(b.getBoundingClientRect().top))
).size)"""

#: Each edge's ends against its nodes, in the graph's own coordinates (as the SVG draws them):
#: how far (px) the start is from the bottom centre of `from`, and the end from the top centre
#: of `to`.
MISSES = """() => {
  const graph = document.getElementById('plan-graph');
  const box = graph.getBoundingClientRect();
  const at = (id) => {
    const r = graph.querySelector(`button[data-node="${CSS.escape(id)}"]`).getBoundingClientRect();
    return {x: r.left + r.width / 2 - box.left + graph.scrollLeft,
            top: r.top - box.top + graph.scrollTop, bottom: r.bottom - box.top + graph.scrollTop};
  };
  return [...graph.querySelectorAll('svg.edges path')].map((p) => {
    const n = p.getAttribute('d').match(/-?[0-9.]+/g).map(Number);
    const a = at(p.getAttribute('data-from')), b = at(p.getAttribute('data-to'));
    return Math.max(Math.abs(n[0] - a.x), Math.abs(n[1] - a.bottom),
                    Math.abs(n.at(-2) - b.x), Math.abs(n.at(-1) - b.top));
  });
}"""


def misses(tab: Any) -> list[float]:
    """MISSES once the edges are drawn: a redraw of the graph (a new revision, the stream)
    draws its edges on the next animation frame after its nodes, so a read in between finds
    none."""
    drawn = tab.wait_for_function(
        f"() => {{ const m = ({MISSES})(); return m.length ? m : null; }}"
    )
    return list(drawn.json_value())


#: Whether a node is wholly inside the graph's visible box.
IN_VIEW = """(id) => {
  const graph = document.getElementById('plan-graph').getBoundingClientRect();
  const r = document.querySelector(`button.node[data-node="${CSS.escape(id)}"]`)
    .getBoundingClientRect();
  return r.left >= graph.left - 1.5 && r.right <= graph.right + 1.5;  // scrolled by whole px
}"""

#: Pairs of edge labels drawn over one another.
OVERLAPS = """() => {
  const boxes = [...document.querySelectorAll('#plan-graph svg.edges text')]
    .map((t) => [t.textContent, t.getBoundingClientRect()]);
  const hits = [];
  boxes.forEach(([a, r], i) => boxes.slice(i + 1).forEach(([b, q]) => {
    const apart = r.right <= q.left || q.right <= r.left || r.bottom <= q.top || q.bottom <= r.top;
    if (!apart) hits.push([a, b]);
  }));
  return hits;
}"""

#: The edges that run behind a node other than their own two: [from, to, node].
BEHIND = """() => {
  const nodes = [...document.querySelectorAll('#plan-graph button.node')]
    .map((b) => [b.getAttribute('data-node'), b.getBoundingClientRect()]);
  const hits = [];
  for (const p of document.querySelectorAll('#plan-graph svg.edges path')) {
    const from = p.getAttribute('data-from'), to = p.getAttribute('data-to');
    const matrix = p.getScreenCTM();
    const length = p.getTotalLength();
    for (let at = 0; at <= length; at += 2) {
      const point = p.getPointAtLength(at);
      const q = new DOMPoint(point.x, point.y).matrixTransform(matrix);
      for (const [id, r] of nodes) {
        if (id === from || id === to) continue;
        const inside = q.x > r.left && q.x < r.right && q.y > r.top && q.y < r.bottom;
        if (inside) hits.push([from, to, id]);
      }
    }
  }
  return [...new Set(hits.map((h) => h.join(' ')))];
}"""

#: Each edge label drawn across an edge's line, its own or another's: [label, from, to], where
#: a point of the line (sampled each px along it) is inside the label's box (its text and
#: tspans as drawn) or within 1 px of it.
CROSSINGS = """() => {
  const graph = document.getElementById('plan-graph');
  const lines = [...graph.querySelectorAll('svg.edges path')].map((p) => {
    const matrix = p.getScreenCTM();
    const points = [];
    for (let at = 0, length = p.getTotalLength(); at <= length; at += 1) {
      const point = p.getPointAtLength(at);
      points.push(new DOMPoint(point.x, point.y).matrixTransform(matrix));
    }
    return [p.getAttribute('data-from'), p.getAttribute('data-to'), points];
  });
  const hits = [];
  for (const t of graph.querySelectorAll('svg.edges text')) {
    const r = t.getBoundingClientRect();
    for (const [from, to, points] of lines) {
      const crossed = points.some((q) => q.x > r.left - 1 && q.x < r.right + 1
        && q.y > r.top - 1 && q.y < r.bottom + 1);
      if (crossed) hits.push([t.textContent, from, to]);
    }
  }
  return hits;
}"""

#: Each edge label drawn over a node, or past the graph's box: [label, node or "graph"].
LABELS_OUT = """() => {
  const graph = document.getElementById('plan-graph');
  const box = graph.getBoundingClientRect();
  const nodes = [...graph.querySelectorAll('button.node')]
    .map((b) => [b.getAttribute('data-node'), b.getBoundingClientRect()]);
  const hits = [];
  for (const t of graph.querySelectorAll('svg.edges text')) {
    const r = t.getBoundingClientRect();
    for (const [id, q] of nodes) {
      const apart = r.right <= q.left || q.right <= r.left
        || r.bottom <= q.top || q.bottom <= r.top;
      if (!apart) hits.push([t.textContent, id]);
    }
    const inside = r.left >= box.left && r.right <= box.right && r.top >= box.top
      && r.bottom <= box.bottom;
    if (!inside) hits.push([t.textContent, 'graph']);
  }
  return hits;
}"""

OVERFLOW = """() => {
  const doc = document.documentElement, graph = document.getElementById('plan-graph');
  return {page: doc.scrollWidth - doc.clientWidth, graph: graph.scrollWidth - graph.clientWidth};
}"""


@pytest.fixture(scope="module")
def branched_task(console: Console) -> str:
    task_id = console.trigger("branches", "Six branches")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    return task_id


@pytest.mark.parametrize(
    ("width", "scale"),
    [(320, 1), (375, 2), (640, 2), (1280, 1)],
    ids=["320px", "375px", "zoom200", "1280px"],
)
def test_parallel_branches_stay_side_by_side_with_edges_on_their_nodes(
    browser: Any, console: Console, branched_task: str, width: int, scale: int
) -> None:
    with task_tab(browser, console, branched_task, width, 800, scale) as tab:
        expect(tab.locator("#live")).to_have_text("live")  # the stream's snapshot is drawn
        expect(tab.locator("svg.edges path")).to_have_count(12)
        expect(tab.locator("ol.layers > li")).to_have_count(3)  # triage, six branches, close
        expect(tab.locator("ol.layers > li").nth(1).locator("button.node")).to_have_count(6)
        assert tab.evaluate(ROWS) == [1, 1, 1]
        # The six branches are wider than the card: the graph scrolls, the page does not.
        overflow = tab.evaluate(OVERFLOW)
        assert overflow["page"] == 0
        assert overflow["graph"] > 0
        assert max(misses(tab)) < 2
        # Opened on the middle, where the trunk runs: its first and last steps wholly in view.
        assert tab.evaluate(IN_VIEW, "triage")
        assert tab.evaluate(IN_VIEW, "close")
        # Each edge's condition label can be read: none is drawn over another.
        expect(tab.locator("svg.edges text")).to_have_count(12)
        assert tab.evaluate(OVERLAPS) == []
        assert tab.evaluate(CROSSINGS) == []
        shot(tab, f"branches-{width}px-x{scale}")
        # The arrow keys go along the branches to the last one: it is scrolled fully into
        # view (a node half in view took focus and stayed half hidden), and each edge still
        # ends on its nodes.
        tab.locator('button.node[data-node="scada"]').focus()
        for _ in range(5):
            tab.keyboard.press("ArrowRight")
        expect(tab.locator('button.node[data-node="hydrant"]')).to_be_focused()
        assert tab.evaluate(IN_VIEW, "hydrant")
        assert tab.evaluate("document.getElementById('plan-graph').scrollLeft") > 0
        assert max(misses(tab)) < 2
        tab.keyboard.press("Enter")
        expect(tab.locator("#node-detail")).to_contain_text("hydrant")
        shot(tab, f"branches-{width}px-x{scale}-scrolled")


def test_a_new_revision_keeps_the_graph_where_it_was_scrolled(
    browser: Any, console: Console
) -> None:
    task_id = console.trigger("branches", "Six branches, one closed")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    with task_tab(browser, console, task_id, 320, 800) as tab:
        expect(tab.locator("#live")).to_have_text("live")
        expect(tab.locator("#status-counts")).to_contain_text("waiting 2")
        # Swiped to the far end of the branches (no focus moves with a swipe).
        right = tab.evaluate(
            "(() => { const g = document.getElementById('plan-graph');"
            " g.scrollLeft = g.scrollWidth; return g.scrollLeft; })()"
        )
        assert right > 0
        # A crew closes a step: the new revision is drawn, and the graph stays where it was.
        closed = console.http.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"evidence": "tap 3 sampled: 0.4 NTU", "by": "crew lead"},
        )
        assert closed.status_code == 200, closed.text
        expect(tab.locator("#status-counts")).to_contain_text("waiting 1")
        assert tab.evaluate("document.getElementById('plan-graph').scrollLeft") == right
        # The new revision's edges are drawn on the next animation frame, after its nodes.
        expect(tab.locator("svg.edges path")).to_have_count(12)
        assert max(misses(tab)) < 2


@pytest.mark.parametrize("width", [320, 1280], ids=["320px", "1280px"])
def test_an_edge_that_skips_a_layer_goes_around_the_nodes_between(
    browser: Any, console: Console, width: int
) -> None:
    """triage → lab and triage → close skip the steps between them: drawn straight down, they
    ran behind sample and lab and read as part of the chain."""
    task_id = console.trigger("skips", f"Skipping edges at {width} px")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    with task_tab(browser, console, task_id, width, 900) as tab:
        expect(tab.locator("svg.edges path")).to_have_count(5)
        expect(tab.locator("ol.layers > li")).to_have_count(4)
        assert tab.evaluate(BEHIND) == []
        # Nor are they drawn as the trunk, the chain they skip.
        expect(tab.locator("svg.edges path.trunk")).to_have_count(3)
        assert max(misses(tab)) < 2
        assert tab.evaluate(OVERLAPS) == []
        assert tab.evaluate(CROSSINGS) == []
        assert tab.evaluate(OVERFLOW)["page"] == 0
        shot(tab, f"skips-{width}px")


#: Each edge label's lines as drawn (its tspans, or its text when on one line).
LABEL_LINES = """() => [...document.querySelectorAll('#plan-graph svg.edges text')].map((t) => {
  const spans = [...t.querySelectorAll('tspan')];
  return spans.length ? spans.map((s) => s.textContent) : [t.textContent];
})"""


@pytest.mark.parametrize("width", [320, 1280], ids=["320px", "1280px"])
def test_labels_longer_than_the_gap_between_siblings_do_not_overlap(
    browser: Any, console: Console, width: int
) -> None:
    task_id = console.trigger("labels", f"Long labels at {width} px")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    with task_tab(browser, console, task_id, width, 900) as tab:
        expect(tab.locator("svg.edges text")).to_have_count(3)
        # Before, each ran on over its neighbour's.
        assert tab.evaluate(OVERLAPS) == []
        assert tab.evaluate(CROSSINGS) == []
        lines = tab.evaluate(LABEL_LINES)
        assert all(len(label) <= 2 for label in lines)
        if width == 1280:  # two lines hold it all on a desk
            assert sorted(" ".join(label) for label in lines) == sorted(
                LONG_LABEL.format(i) for i in ("east", "north", "south")
            )
        else:  # on a phone what does not fit ends in an ellipsis, the rest read as written
            for label in lines:
                assert LONG_LABEL.format("")[:6] in label[0]
                assert label[-1].endswith("…")
            # The whole condition is a hover away.
            titles = tab.evaluate(
                "[...document.querySelectorAll('#plan-graph svg.edges text.cut > title')]"
                ".map((t) => t.textContent)"
            )
            assert sorted(titles) == sorted(
                LONG_LABEL.format(i) for i in ("east", "north", "south")
            )
        shot(tab, f"labels-{width}px")


@pytest.mark.parametrize("width", [1920, 1280, 1024, 768, 390], ids=lambda w: f"{w}px")
def test_edge_labels_sit_clear_of_the_edges_lines(
    browser: Any, console: Console, width: int
) -> None:
    """A label drawn at its edge's end, over the branch it leads to, lay across its own line
    where the line came in from the other side, and across its siblings' lines on their way
    to the nodes beside: the reader could not see where an edge went. Each sits beside the
    straight end of its own line, clear of every line, of the nodes and of the other labels,
    inside the graph."""
    task_id = console.trigger("conditions", f"Conditions at {width} px")
    console.wait_for(task_id, lambda t: t["status"] == "completed")
    with task_tab(browser, console, task_id, width, 900) as tab:
        expect(tab.locator("svg.edges path")).to_have_count(7)
        expect(tab.locator("svg.edges text")).to_have_count(6)
        assert max(misses(tab)) < 2
        # The whole plan fits the card at these widths: nothing to scroll past.
        assert tab.evaluate(OVERFLOW) == {"page": 0, "graph": 0}
        assert tab.evaluate(CROSSINGS) == []
        assert tab.evaluate(LABELS_OUT) == []
        assert tab.evaluate(OVERLAPS) == []
        assert tab.evaluate(BEHIND) == []
        if width >= 1024:  # on a desk the long condition is read whole
            lines = tab.evaluate(LABEL_LINES)
            assert CONDITION in [" ".join(label) for label in lines]
        shot(tab, f"conditions-{width}px")


def test_a_waiting_task_says_what_it_waits_on_now(browser: Any, console: Console) -> None:
    """A person's step that leaves the task waiting says anew what it waits on: the page shows
    the new reason, not the one the round ended with."""
    task_id = console.trigger("branches", "Six branches, waiting")
    console.wait_for(task_id, lambda t: t["status"] == "waiting")
    with task_tab(browser, console, task_id, 1280, 720) as tab:
        expect(tab.locator("#live")).to_have_text("live")
        expect(tab.locator("#waiting-on")).to_contain_text("human node(s) not completed")
        expect(tab.locator("#waiting-on")).to_contain_text("sample")
        closed = console.http.post(
            f"/api/v1/tasks/{task_id}/nodes/sample/complete",
            json={"evidence": "tap 3 sampled: 0.4 NTU", "by": "crew lead"},
        )
        assert closed.status_code == 200, closed.text
        expect(tab.locator("#status-counts")).to_contain_text("waiting 1")
        expect(tab.locator("#waiting-on")).to_contain_text("human node(s) not completed")
        expect(tab.locator("#waiting-on")).not_to_contain_text("sample")
