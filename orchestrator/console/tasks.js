/* The task list (#/): the filters, a page of tasks, and the pager. */
import { errorText, watched } from "./api.js";
import { now, when, zoneOf } from "./clock.js";
import { badge, el, fill } from "./text.js";
import { POLL_MS, main, redraw, shownAt, viewKey } from "./views.js";
import { handedBack, itemsOf, table, wakeUpUnsent } from "./widgets.js";

const STATUSES = ["queued", "running", "waiting", "completed", "failed", "cancelled"];

// ---- task list -------------------------------------------------------------------------
// Every filter is a query parameter of GET /api/v1/tasks, so each page holds the filter's
// rows and `next_cursor` leads to the next of them. "Created" is fixed when the view opens:
// every page and every refresh asks for the same range. "From" and "To" are the browser's
// local time (what the operator reads on the wall clock), sent in UTC; "From" replaces the
// preset, and a range the API refuses (To not after From) is said above the list.
const SINCE = { "": "any time", "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days" };
const SINCE_MS = { "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3 };
const LOCAL_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?$/;

function localTime(value) {
  // A `datetime-local` value, or "" for anything else (a hand-edited address).
  return LOCAL_TIME.test(value || "") && !isNaN(new Date(value)) ? value : "";
}

export function taskList(params) {
  // A page size as typed in the address: a whole number, at most 200 (the API's most).
  const sized = params.get("limit") || "";
  const size = /^\d+$/.test(sized) ? Number(sized) : 0;
  const since = SINCE_MS[params.get("since")] ? params.get("since") : "";
  const from = localTime(params.get("from")), to = localTime(params.get("to"));
  const after = from ? new Date(from).toISOString()
    : since ? new Date(now() - SINCE_MS[since]).toISOString() : null;
  const state = { status: params.get("status") || "", type: (params.get("type") || "").trim(),
    since, from, to, after, before: to ? new Date(to).toISOString() : null,
    cursors: [], cursor: null, timer: null, alive: true, held: new Map(), key: viewKey(),
    asked: 0, drawn: 0, // each read numbered: one older than a read drawn is not drawn
    limit: size >= 1 ? Math.min(200, size) : 50 };
  const rows = el("div", { id: "task-rows" }, el("p", { class: "muted" }, "Loading…"));
  const pager = el("div", { class: "pager" });
  const form = el("form", { class: "filters", id: "filters", onsubmit: (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = new URLSearchParams();
    for (const key of ["status", "type", "since", "from", "to"]) {
      const value = String(data.get(key) || "").trim();
      if (value) next.set(key, value);
    }
    if (params.get("limit")) next.set("limit", String(state.limit));
    const hash = `#/?${next}`;
    if (location.hash === hash) redraw(); else location.hash = hash; // again: a fresh range
  } },
  el("div", { class: "field" }, el("label", { for: "f-status" }, "Status"),
    el("select", { id: "f-status", name: "status" },
      el("option", { value: "" }, "any"),
      STATUSES.map((s) => el("option", { value: s, selected: s === state.status }, s)))),
  el("div", { class: "field" }, el("label", { for: "f-type" }, "Type"),
    el("input", { id: "f-type", name: "type", value: state.type, size: 18, maxlength: 64 })),
  el("div", { class: "field" }, el("label", { for: "f-since" }, "Created"),
    el("select", { id: "f-since", name: "since" },
      Object.entries(SINCE).map(([k, v]) => el("option", { value: k, selected: k === state.since }, v)))),
  // Typed in the browser's zone, named: "From" alone left the operator to guess it.
  el("div", { class: "field" }, el("label", { for: "f-from" }, `From (${zoneOf(new Date())})`),
    el("input", { id: "f-from", name: "from", type: "datetime-local", value: state.from })),
  el("div", { class: "field" }, el("label", { for: "f-to" }, `To (${zoneOf(new Date())})`),
    el("input", { id: "f-to", name: "to", type: "datetime-local", value: state.to })),
  el("button", { type: "submit" }, "Filter"));
  // A hand-edited address with a value the filters cannot hold is not an error, but it is
  // said: "from=yesterday" quietly listing every task reads as "every task is from today".
  const ignored = [];
  if (params.get("since") && !since) ignored.push(`since=${params.get("since")} (one of 1h, 24h, 7d)`);
  if (params.get("from") && !from) ignored.push(`from=${params.get("from")} (a local time, 2026-12-04T09:00)`);
  if (params.get("to") && !to) ignored.push(`to=${params.get("to")} (a local time, 2026-12-04T11:30)`);
  // `limit=abc` listed 50 and `limit=500` 200, unsaid: a short list read as every task.
  if (sized && !(size >= 1 && size <= 200)) ignored.push(`limit=${sized} (a page size from 1 to 200)`);
  if (params.get("status") && !STATUSES.includes(state.status)) {
    ignored.push(`status=${params.get("status")} (one of ${STATUSES.join(", ")})`);
    state.status = "";
  }
  const notice = ignored.length ? el("p", { class: "notice", id: "filter-ignored", role: "status" },
    `Not understood, so not applied: ${ignored.join("; ")}.`) : null;
  fill(main, el("h1", {}, "Tasks"), el("section", { class: "card" }, form, notice, rows, pager));

  async function load() {
    const query = new URLSearchParams({ limit: String(state.limit) });
    if (state.status) query.set("status", state.status);
    if (state.type) query.set("task_type", state.type);
    if (state.after) query.set("created_after", state.after);
    if (state.before) query.set("created_before", state.before);
    if (state.cursor) query.set("cursor", state.cursor);
    const asked = ++state.asked;
    const path = `tasks?${query}`;
    const result = await watched(state.held, path);
    if (!state.alive || !shownAt(state.key)) return;
    // Unchanged since this page was last read; as shown only if it is the page shown: back
    // to a page read before (Newer), its 304 left the page left on screen under every poll.
    if (result.unchanged && path === state.shownPath) return;
    // A slow poll of the page left, answered after the page asked for (Older, Newer, Show
    // more): drawn, it put the old rows under the new page's number until the next poll.
    if (asked < state.drawn) return;
    state.drawn = asked;
    state.shownPath = result.ok ? path : null;
    if (!result.ok) {
      if (!result.down) { fill(rows, el("p", { class: "error", id: "list-error" }, errorText(result))); fill(pager); state.seen = null; }
      return;
    }
    const seen = JSON.stringify([result.data, state.cursor, state.limit]);
    if (seen === state.seen) return; // unchanged: keep the focus where it is
    state.seen = seen;
    const tasks = itemsOf(result.data);
    fill(rows, tasks.length === 0 ? el("p", { class: "muted" }, "No tasks match.") :
      table(["Task", "Status", "Type", "Generation", "Created", "Updated"], tasks.map((t) => [
        el("a", { href: `#/task/${encodeURIComponent(t.task_id)}`, class: "task-link" }, t.title || t.task_id),
        [badge(t.status), t.failure_code ? ` ${t.failure_code}` : "", handedBack(t), wakeUpUnsent(t)],
        t.task_type, String(t.generation), when(t.created_at), when(t.updated_at)])));
    const next = result.data.next_cursor;
    fill(pager,
      state.cursors.length ? el("button", { class: "secondary", type: "button", id: "prev-page", onclick: () => {
        state.cursor = state.cursors.pop() || null; load(); } }, "← Newer") : null,
      next ? el("button", { class: "secondary", type: "button", id: "next-page", onclick: () => {
        state.cursors.push(state.cursor); state.cursor = next; load(); } }, "Older →") : null,
      state.cursors.length || next ? el("span", { class: "muted", id: "page-number" }, `page ${state.cursors.length + 1}`) : null,
      // A server without cursors: ask for a longer page, up to the API's 200.
      !next && tasks.length >= state.limit && state.limit < 200
        ? el("button", { class: "secondary", type: "button", id: "more", onclick: () => {
          state.limit = Math.min(200, state.limit + 50); load(); } }, "Show more") : null);
  }
  load();
  state.timer = setInterval(load, POLL_MS * 2);
  return { dispose() { state.alive = false; clearInterval(state.timer); } };
}
