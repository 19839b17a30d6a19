/* A plan drawn as a graph: its nodes in layers, the edges between them, the counts by status. */
import { badge, el, shown } from "./text.js";
import { edgesOf, isObject, nodesOf, unreadable } from "./widgets.js";

// ---- plan graph ------------------------------------------------------------------------
function layout(nodes, edges) {
  const ids = nodes.map((n) => n.id);
  const incoming = new Map(ids.map((id) => [id, []]));
  const outgoing = new Map(ids.map((id) => [id, []]));
  for (const e of edges) {
    if (incoming.has(e.to) && outgoing.has(e.from)) {
      incoming.get(e.to).push(e.from);
      outgoing.get(e.from).push(e.to);
    }
  }
  // Longest path from a root gives the layer; Kahn's order keeps it linear.
  const layer = new Map(ids.map((id) => [id, 0]));
  const indegree = new Map(ids.map((id) => [id, incoming.get(id).length]));
  const queue = ids.filter((id) => indegree.get(id) === 0);
  const order = [];
  while (queue.length) {
    const id = queue.shift();
    order.push(id);
    for (const to of outgoing.get(id)) {
      layer.set(to, Math.max(layer.get(to), layer.get(id) + 1));
      indegree.set(to, indegree.get(to) - 1);
      if (indegree.get(to) === 0) queue.push(to);
    }
  }
  for (const id of ids) if (!order.includes(id)) order.push(id); // never for a valid plan
  // The trunk: the longest chain, followed back from its deepest node.
  const depth = new Map();
  const prev = new Map();
  for (const id of order) {
    depth.set(id, depth.get(id) || 1);
    for (const to of outgoing.get(id)) {
      if ((depth.get(to) || 0) < depth.get(id) + 1) { depth.set(to, depth.get(id) + 1); prev.set(to, id); }
    }
  }
  const trunk = new Set();
  let end = order.reduce((best, id) => (best === null || depth.get(id) > depth.get(best) ? id : best), null);
  while (end !== undefined && end !== null) { trunk.add(end); end = prev.get(end); }
  const layers = [];
  for (const id of ids) {
    const n = layer.get(id);
    (layers[n] = layers[n] || []).push(id);
  }
  return { layers: layers.filter(Boolean), trunk };
}

export function planGraph(plan, selected, onSelect) {
  const byId = new Map(nodesOf(plan).map((n) => [n.id, n]));
  const { layers, trunk } = layout(nodesOf(plan), edgesOf(plan));
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "edges");
  svg.setAttribute("aria-hidden", "true");
  const list = el("ol", { class: "layers", "aria-label": "Plan nodes by step" },
    layers.map((ids, index) => el("li", { "aria-label": `step ${index + 1}` }, ids.map((id) => {
      const n = byId.get(id);
      return el("button", {
        type: "button", class: `node${trunk.has(id) ? " trunk" : ""}`, "data-node": id,
        "aria-pressed": String(id === selected), "aria-controls": "node-detail",
        onclick: () => onSelect(id),
      }, el("span", { class: "title" }, n.title),
      el("span", { class: "meta" }, badge(n.status), n.actor === "human" ? el("span", { class: "badge" }, "human") : null));
    }))));
  // A node taking focus in a graph scrolled sideways comes wholly into view: Chromium leaves
  // one that is half in view where it is.
  list.addEventListener("focusin", (event) => {
    if (event.target.matches("button.node")) event.target.scrollIntoView({ block: "nearest", inline: "nearest" });
  });
  // Arrow keys move between nodes in reading order (Tab reaches each of them too).
  list.addEventListener("keydown", (event) => {
    const keys = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
    if (!(event.key in keys) || !event.target.matches("button.node")) return;
    const buttons = [...list.querySelectorAll("button.node")];
    const next = buttons[buttons.indexOf(event.target) + keys[event.key]];
    if (next) { event.preventDefault(); next.focus(); }
  });
  const graph = el("div", { class: "graph", id: "plan-graph" }, svg, list);
  function draw() {
    if (!graph.isConnected) return;
    // In the graph's own coordinates: a layer wider than the card scrolls the graph, and the
    // SVG (its overflow visible) scrolls with the nodes. Sized to the card, not to the
    // scrolled width, which it would then hold wide when the card narrows.
    const box = graph.getBoundingClientRect();
    const dx = graph.scrollLeft - box.left, dy = graph.scrollTop - box.top;
    svg.replaceChildren();
    const fans = { out: new Map(), in: new Map() };
    for (const e of edgesOf(plan)) {
      fans.out.set(e.from, (fans.out.get(e.from) || 0) + 1);
      fans.in.set(e.to, (fans.in.get(e.to) || 0) + 1);
    }
    const lanes = { left: 0, right: 0 };
    const labels = [];
    for (const e of edgesOf(plan)) {
      const a = graph.querySelector(`button[data-node="${CSS.escape(e.from)}"]`);
      const b = graph.querySelector(`button[data-node="${CSS.escape(e.to)}"]`);
      if (!a || !b) continue;
      const ra = a.getBoundingClientRect();
      const rb = b.getBoundingClientRect();
      const x1 = ra.left + ra.width / 2 + dx, y1 = ra.bottom + dy;
      const x2 = rb.left + rb.width / 2 + dx, y2 = rb.top + dy;
      const mid = (y1 + y2) / 2;
      const path = document.createElementNS(svg.namespaceURI, "path");
      const lane = laneFor(e, Math.min(x1, x2), Math.max(x1, x2), lanes, dx, dy);
      path.setAttribute("d", lane
        ? `M${x1},${y1} C${x1},${(y1 + lane.top) / 2} ${lane.x},${(y1 + lane.top) / 2} ${lane.x},${lane.top} `
          + `L${lane.x},${lane.bottom} C${lane.x},${(lane.bottom + y2) / 2} ${x2},${(lane.bottom + y2) / 2} ${x2},${y2}`
        : `M${x1},${y1} C${x1},${mid} ${x2},${mid} ${x2},${y2}`);
      path.setAttribute("data-from", e.from);
      path.setAttribute("data-to", e.to);
      // The trunk's own edges join consecutive layers: one skipping a layer between two trunk
      // nodes is not part of the chain.
      if (trunk.has(e.from) && trunk.has(e.to) && layerOf.get(e.to) - layerOf.get(e.from) === 1) path.setAttribute("class", "trunk");
      svg.appendChild(path);
      if (e.label) {
        // Beside the line at the end where edges fan out (over the branch it leads to, under
        // the branch it leaves): at the middle, the labels of sibling edges lay over one
        // another and none could be read.
        const fanOut = fans.out.get(e.from) || 0, fanIn = fans.in.get(e.to) || 0;
        // An edge around the steps it skips: over the step it leads to (its middle is behind
        // them, and its lane at the graph's edge leaves no room).
        const [x, y] = lane || (fanOut > 1 && fanOut >= fanIn) ? [x2, y2 - 4]
          : fanIn > 1 ? [x1, y1 + 12] : [(x1 + x2) / 2, mid];
        const text = document.createElementNS(svg.namespaceURI, "text");
        text.setAttribute("x", String(x + 4));
        text.setAttribute("y", String(y));
        text.textContent = shown(e.label);
        svg.appendChild(text);
        labels.push({ text, label: shown(e.label), x: x + 4, y, up: y >= (y1 + y2) / 2 });
      }
    }
    fitLabels(labels, graph.scrollWidth);
  }
  // A label longer than the room to the next label on its line (the next sibling's) ran over
  // it and neither could be read: it wraps onto a second line (upward over the step it leads
  // to, downward under the step it leaves), and what a second line cannot hold ends in "…".
  function fitLabels(labels, width) {
    const lines = new Map();
    for (const l of labels) {
      const key = Math.round(l.y);
      (lines.get(key) || lines.set(key, []).get(key)).push(l);
    }
    for (const row of lines.values()) {
      row.sort((a, b) => a.x - b.x);
      row.forEach((l) => {
        // Up to the next label that starts further right (one at the same place, over the
        // same step, is no room to give).
        const next = row.find((other) => other.x > l.x + 1);
        const room = (next ? next.x - 8 : width - 2) - l.x;
        if (l.text.getComputedTextLength() > room) wrapLabel(l, Math.max(room, 24));
      });
    }
  }
  function wrapLabel({ text, label, x, up }, room) {
    const fits = (candidate) => { text.textContent = candidate; return text.getComputedTextLength() <= room; };
    const lines = [];
    let line = "";
    for (const word of label.split(/\s+/).filter(Boolean)) {
      if (lines.length === 2) break;
      const longer = line ? `${line} ${word}` : word;
      if (fits(longer)) { line = longer; continue; }
      if (line) lines.push(line);
      line = word;
    }
    if (line && lines.length < 2) lines.push(line);
    const all = label.split(/\s+/).filter(Boolean).join(" ");
    const last = lines.length - 1;
    const whole = lines.join(" ") === all;
    let shortened = false;
    lines.forEach((part, i) => {
      if (fits(part) && (whole || i < last)) return;
      // Cut the line (a word longer than the room, or the last of a label left unfinished)
      // until it and its ellipsis fit.
      let cut = part;
      while (cut.length > 1 && !fits(`${cut}…`)) cut = cut.slice(0, -1);
      lines[i] = `${cut.trimEnd()}…`;
      shortened = true;
    });
    text.replaceChildren();
    lines.forEach((part, i) => {
      const span = document.createElementNS(svg.namespaceURI, "tspan");
      span.setAttribute("x", String(x));
      span.setAttribute("dy", i ? "1.1em" : up ? `${-1.1 * last}em` : "0");
      span.textContent = part;
      text.appendChild(span);
    });
    if (shortened) {
      // The whole condition on hover (the edges' layer otherwise lets the pointer through).
      const title = document.createElementNS(svg.namespaceURI, "title");
      title.textContent = all;
      text.appendChild(title);
      text.classList.add("cut");
    }
  }
  // An edge that skips a layer, drawn straight, ran behind the nodes of the layers between
  // and read as part of their chain: it goes down a lane beside them instead, on the side
  // with more room (each further edge on that side one lane further out). Null when the
  // straight line passes clear of them.
  const layerOf = new Map(layers.flatMap((ids, index) => ids.map((id) => [id, index])));
  function laneFor(e, left, right, lanes, dx, dy) {
    const from = layerOf.get(e.from), to = layerOf.get(e.to);
    if (from === undefined || to === undefined || to - from < 2) return null;
    const between = layers.slice(from + 1, to).flat()
      .map((id) => graph.querySelector(`button[data-node="${CSS.escape(id)}"]`))
      .filter(Boolean).map((button) => button.getBoundingClientRect());
    if (!between.some((r) => r.left + dx < right + 2 && r.right + dx > left - 2)) return null;
    const outerLeft = Math.min(...between.map((r) => r.left)) + dx;
    const outerRight = Math.max(...between.map((r) => r.right)) + dx;
    const width = graph.scrollWidth;
    const side = width - outerRight >= outerLeft ? 1 : -1;
    const n = side > 0 ? ++lanes.right : ++lanes.left;
    const x = side > 0 ? Math.min(outerRight + 8 * n, width - 2) : Math.max(outerLeft - 8 * n, 2);
    return { x, top: Math.min(...between.map((r) => r.top)) + dy - 4,
      bottom: Math.max(...between.map((r) => r.bottom)) + dy + 4 };
  }
  const observer = new ResizeObserver(() => draw());
  observer.observe(graph);
  requestAnimationFrame(draw);
  graph.dispose = () => observer.disconnect();
  return graph;
}

// Nodes and edges of an older shape, listed as written under the graph they are not in.
export function olderParts(plan) {
  const parts = [...(plan.nodes || []), ...(plan.edges || [])].filter((p) => !isObject(p));
  return parts.length ? el("div", { id: "plan-older" }, el("p", { class: "notice" },
    `${parts.length} node(s) or edge(s) stored by an older version in another shape, as written:`),
    parts.map(unreadable)) : null;
}
export function countsOf(plan) {
  const counts = plan.status_counts || {};
  const shown = Object.entries(counts).filter(([, n]) => n > 0);
  const retried = retriedFailures(plan);
  return el("ul", { class: "counts", "aria-label": "Nodes by status", id: "status-counts" },
    shown.map(([status, n]) => el("li", {}, el("span", { class: `badge s-${status}` },
      `${status} ${n}`, status === "failed" && retried ? ` (${retried} retried)` : ""))));
}
// Failed nodes a completed retry released (domain/decisions.py: a retry the host keeps for
// the failed node, completed; a failed retry passes it on to its own).
function retriedFailures(plan) {
  const released = (node, seen) => retriesIn(plan, node).some((retry) => !seen.has(retry.id)
    && (retry.status === "completed" || (retry.status === "failed" && released(retry, new Set([...seen, retry.id])))));
  return nodesOf(plan).filter((n) => n.status === "failed" && released(n, new Set([n.id]))).length;
}
// The retries of `node`, as the host keeps them (`retries` of the plan, domain/retries.py):
// new nodes of its actor drawn from it at or after its failure. A node that followed it
// before it failed is no retry, though an edge joins them.
export function retriesIn(plan, node) {
  const byId = new Map(nodesOf(plan).map((n) => [n.id, n]));
  const ids = (isObject(plan.retries) && Array.isArray(plan.retries[node.id])) ? plan.retries[node.id] : [];
  return ids.map((id) => byId.get(id)).filter((n) => n);
}
