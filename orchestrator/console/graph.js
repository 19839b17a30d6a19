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
  const layerOf = new Map(layers.flatMap((ids, index) => ids.map((id) => [id, index])));
  // Room on the right for the lanes of the edges that skip a layer (laneFor): with none, a
  // lane beside a layer as wide as the card ran over the border of its last node.
  const skips = edgesOf(plan).filter((e) => layerOf.get(e.to) - layerOf.get(e.from) > 1).length;
  if (skips) list.style.paddingRight = `${8 * skips + 4}px`;
  const graph = el("div", { class: "graph", id: "plan-graph" }, svg, list);
  // Each edge's line runs straight down out of its node, crosses to the other's column in a
  // band across the gap between the two rows, and runs straight down into the other. Its label
  // sits beside one of those straight ends, in the room to the next line: drawn over the end
  // of a line that came in sideways, a label lay across it and across its siblings' lines on
  // their way to the nodes beside, and the reader could not see where an edge went. A gap
  // with labels grows to hold them over or under its band.
  const BAND = 12; // the least height of the band the lines cross in
  const PAD = 2; // between a label and the band or a node
  const ASIDE = 5; // between a label and the line it is beside, or the next line
  const nodeOf = (id) => graph.querySelector(`button[data-node="${CSS.escape(id)}"]`);
  function draw(inObserver = false) {
    if (!graph.isConnected) return;
    // In the graph's own coordinates: a layer wider than the card scrolls the graph, and the
    // SVG (its overflow visible) scrolls with the nodes. Sized to the card, not to the
    // scrolled width, which it would then hold wide when the card narrows.
    const box = graph.getBoundingClientRect();
    const dx = graph.scrollLeft - box.left, dy = graph.scrollTop - box.top;
    const width = graph.scrollWidth;
    svg.replaceChildren();
    const lines = document.createElementNS(svg.namespaceURI, "g");
    const words = document.createElementNS(svg.namespaceURI, "g");
    svg.append(lines, words); // the labels over the lines
    const centre = (button) => { const r = button.getBoundingClientRect(); return r.left + r.width / 2 + dx; };
    const lanes = { left: 0, right: 0 };
    const edges = [];
    for (const e of edgesOf(plan)) {
      const a = nodeOf(e.from), b = nodeOf(e.to);
      if (!a || !b) continue;
      const from = layerOf.get(e.from), to = layerOf.get(e.to);
      const x1 = centre(a), x2 = centre(b);
      // An edge past a layer goes down a column between its two crossings: a lane beside the
      // nodes it skips, or the column of the node it leads to when that is clear of them.
      const column = to - from > 1 ? laneFor(e, Math.min(x1, x2), Math.max(x1, x2), lanes, dx) ?? x2 : null;
      edges.push({ e, a, b, from, to, x1, x2, column, forward: to > from });
    }
    // The straight parts of the lines in each gap's zone over its band ("top") and under it
    // ("bottom"), by their x.
    const straight = new Map();
    const along = (gap, side, x) => {
      const key = `${gap} ${side}`;
      (straight.get(key) || straight.set(key, []).get(key)).push(x);
    };
    for (const { from, to, x1, x2, column, forward } of edges) {
      if (!forward) continue;
      along(from, "top", x1);
      along(to - 1, "bottom", x2);
      if (column === null) continue;
      along(from, "bottom", column);
      for (let gap = from + 1; gap < to - 1; gap += 1) { along(gap, "top", column); along(gap, "bottom", column); }
      along(to - 1, "top", column);
    }
    // A label goes at the end it has to itself: beside the line into its node where no other
    // label leads there (the branches out of one step), else beside the line out of the
    // node it leaves (the branches into one step); else at the end with fewer.
    const labelled = edges.filter((d) => d.e.label && d.forward);
    const into = counts(labelled.map((d) => d.e.to)), outOf = counts(labelled.map((d) => d.e.from));
    for (const d of labelled) d.end = into.get(d.e.to) === 1 ? "in" : outOf.get(d.e.from) === 1 ? "out" : null;
    for (const d of labelled.filter((l) => !l.end)) {
      const taken = (end, id) => labelled.filter((l) => l.end === end && (end === "in" ? l.e.to : l.e.from) === id).length;
      d.end = taken("in", d.e.to) <= taken("out", d.e.from) ? "in" : "out";
    }
    const labels = [];
    for (const d of labelled) {
      const [gap, side, at] = d.end === "in" ? [d.to - 1, "bottom", d.x2] : [d.from, "top", d.x1];
      const x = at + ASIDE;
      const next = Math.min(width - 2 + ASIDE, ...(straight.get(`${gap} ${side}`) || []).filter((v) => v > at + 1));
      const text = labelText(d.e.label, x, words);
      fitLabel(text, d.e.label, x, next - ASIDE - x);
      labels.push({ text, gap, side, at: Math.round(at), box: text.getBBox() });
    }
    // Labels beside the same line stack, each under the one before.
    const zones = new Map();
    for (const l of labels) {
      const key = `${l.gap} ${l.side}`;
      const zone = zones.get(key) || zones.set(key, new Map()).get(key);
      const stack = zone.get(l.at) || zone.set(l.at, { height: -PAD }).get(l.at);
      l.offset = stack.height + PAD;
      stack.height = l.offset + l.box.height;
    }
    const zoneHeight = (gap, side) => {
      const zone = zones.get(`${gap} ${side}`);
      return zone ? Math.max(...[...zone.values()].map((s) => s.height)) + 2 * PAD : 0;
    };
    // The gaps that hold labels grow to hold them and the band; one without keeps the whole gap
    // for its band. Not while the observer reports a size: a size changed then is an error of
    // the page ("loop completed with undelivered notifications"); the next frame does it.
    const items = [...list.children];
    const base = parseFloat(getComputedStyle(list).rowGap) || 0;
    const margins = items.map((li, i) => {
      const above = zoneHeight(i - 1, "top"), below = zoneHeight(i - 1, "bottom");
      const need = above || below ? above + BAND + below : 0;
      return i && need > base ? `${Math.ceil(need - base)}px` : "";
    });
    if (margins.some((m, i) => items[i].style.marginTop !== m)) {
      if (inObserver) requestAnimationFrame(() => draw());
      else items.forEach((li, i) => { li.style.marginTop = margins[i]; });
    }
    const rows = layers.map((ids) => {
      const rects = ids.map(nodeOf).filter(Boolean).map((button) => button.getBoundingClientRect());
      return { top: Math.min(...rects.map((r) => r.top)) + dy, bottom: Math.max(...rects.map((r) => r.bottom)) + dy };
    });
    const bands = rows.slice(1).map((row, gap) => {
      const top = rows[gap].bottom + zoneHeight(gap, "top"), bottom = row.top - zoneHeight(gap, "bottom");
      return { top, bottom: Math.max(bottom, top) };
    });
    const cross = (xa, xb, gap) => {
      const { top, bottom } = bands[gap], mid = (top + bottom) / 2;
      return `L${xa},${top} C${xa},${mid} ${xb},${mid} ${xb},${bottom}`;
    };
    for (const { e, a, b, from, to, x1, x2, column, forward } of edges) {
      const y1 = a.getBoundingClientRect().bottom + dy, y2 = b.getBoundingClientRect().top + dy;
      const mid = (y1 + y2) / 2;
      const path = document.createElementNS(svg.namespaceURI, "path");
      path.setAttribute("d", !forward ? `M${x1},${y1} C${x1},${mid} ${x2},${mid} ${x2},${y2}` // never for a valid plan
        : `M${x1},${y1} ${column === null ? cross(x1, x2, from) : `${cross(x1, column, from)} ${cross(column, x2, to - 1)}`} L${x2},${y2}`);
      path.setAttribute("data-from", e.from);
      path.setAttribute("data-to", e.to);
      // The trunk's own edges join consecutive layers: one skipping a layer between two trunk
      // nodes is not part of the chain.
      if (trunk.has(e.from) && trunk.has(e.to) && to - from === 1) path.setAttribute("class", "trunk");
      lines.appendChild(path);
      if (e.label && !forward) labelText(e.label, (x1 + x2) / 2 + ASIDE, words).setAttribute("y", String(mid));
    }
    // Over the band, a label hangs from the node it leaves; under it, stands on the one it
    // leads to.
    for (const l of labels) {
      const top = l.side === "top" ? rows[l.gap].bottom + PAD + l.offset
        : rows[l.gap + 1].top - PAD - l.offset - l.box.height;
      l.text.setAttribute("y", String(top - l.box.y));
    }
  }
  function labelText(label, x, parent) {
    const text = document.createElementNS(svg.namespaceURI, "text");
    text.setAttribute("x", String(x));
    text.setAttribute("y", "0");
    text.textContent = shown(label);
    parent.appendChild(text);
    return text;
  }
  // A label longer than the room to the next line (a sibling's, or the graph's edge) wraps onto
  // a second line, and what a second line cannot hold ends in "…".
  function fitLabel(text, label, x, room) {
    if (text.getComputedTextLength() <= room) return;
    room = Math.max(room, 24);
    const fits = (candidate) => { text.textContent = candidate; return text.getComputedTextLength() <= room; };
    const all = shown(label).split(/\s+/).filter(Boolean);
    const lines = [];
    let line = "";
    for (const word of all) {
      if (lines.length === 2) break;
      const longer = line ? `${line} ${word}` : word;
      if (fits(longer)) { line = longer; continue; }
      if (line) lines.push(line);
      line = word;
    }
    if (line && lines.length < 2) lines.push(line);
    const last = lines.length - 1;
    const whole = lines.join(" ") === all.join(" ");
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
      span.setAttribute("dy", i ? "1.1em" : "0");
      span.textContent = part;
      text.appendChild(span);
    });
    if (shortened) {
      // The whole condition on hover (the edges' layer otherwise lets the pointer through).
      const title = document.createElementNS(svg.namespaceURI, "title");
      title.textContent = all.join(" ");
      text.appendChild(title);
      text.classList.add("cut");
    }
  }
  // An edge that skips a layer, drawn straight, ran behind the nodes of the layers between
  // and read as part of their chain: it goes down a lane beside them instead, on the side
  // with more room (each further edge on that side one lane further out). The lane's x, or
  // null when the straight line passes clear of them.
  function laneFor(e, left, right, lanes, dx) {
    const from = layerOf.get(e.from), to = layerOf.get(e.to);
    const between = layers.slice(from + 1, to).flat().map(nodeOf)
      .filter(Boolean).map((button) => button.getBoundingClientRect());
    if (!between.some((r) => r.left + dx < right + 2 && r.right + dx > left - 2)) return null;
    const outerLeft = Math.min(...between.map((r) => r.left)) + dx;
    const outerRight = Math.max(...between.map((r) => r.right)) + dx;
    const width = graph.scrollWidth;
    const side = width - outerRight >= outerLeft ? 1 : -1;
    const n = side > 0 ? ++lanes.right : ++lanes.left;
    return side > 0 ? Math.min(outerRight + 8 * n, width - 2) : Math.max(outerLeft - 8 * n, 2);
  }
  const observer = new ResizeObserver(() => draw(true));
  observer.observe(graph);
  requestAnimationFrame(() => draw());
  graph.dispose = () => observer.disconnect();
  return graph;
}

// How many times each value is in `values`.
function counts(values) {
  const seen = new Map();
  for (const v of values) seen.set(v, (seen.get(v) || 0) + 1);
  return seen;
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
