/* A task's records on its page: the evidence (a page at a time, and the records cited on no
 * page shown, read by id), the transcript, and a cited id's link to its record. */
import { api, errorText, missingRoute, watched } from "./api.js";
import { when } from "./clock.js";
import { append, badge, el, fill } from "./text.js";
import { isObject, itemsOf, json, nodesOf, notice, unreadable } from "./widgets.js";

const TRANSCRIPT_PAGE = 200;
const TRANSCRIPT_PAGES = 5; // at most 1000 entries on the page; the CLI prints them all
// A cited evidence id, as a link to its record in the task's Evidence section: the record is
// there even when it falls on a page not shown (the task page reads cited records by id).
export function citation(id) {
  const text = String(id);
  return el("a", { href: "#", class: "cite", "data-cite": text, onclick: (event) => {
    event.preventDefault(); // the address is the page's route, not an anchor
    const code = document.querySelector(`#evidence code[data-evidence="${CSS.escape(text)}"]`);
    const row = code && code.closest("tr");
    if (!row) return;
    row.setAttribute("tabindex", "-1");
    row.scrollIntoView({ block: "center" });
    row.focus();
  } }, el("code", {}, text));
}
export function finding(f) {
  if (typeof f === "string" || !f || typeof f !== "object") return el("li", {}, String(f));
  const ids = Array.isArray(f.evidence_ids) ? f.evidence_ids : [];
  return el("li", {}, f.text === undefined ? JSON.stringify(f) : String(f.text),
    f.origin ? [" ", badge(f.origin)] : null,
    f.whole_range ? el("span", { class: "muted" }, " (whole range)") : null,
    ids.length ? el("div", { class: "muted small" }, "evidence: ", ids.map((id, i) => [i ? ", " : "", citation(id)])) : null);
}
function entryTitle(e) {
  const what = e.kind === "tool_result" ? ["result of ", el("code", {}, e.tool_name || "?"), " ", e.status ? badge(e.status, true) : null]
    : e.kind === "summary" ? "summary of older messages" : "model";
  return [el("strong", {}, `generation ${e.generation ?? "—"} · turn ${e.turn}`), " ", what,
    e.parent_call_id ? el("span", { class: "muted" }, ` (sub-agent of ${e.parent_call_id})`) : null,
    e.usage ? el("span", { class: "muted" }, ` · ${e.usage.prompt_tokens}+${e.usage.completion_tokens} tokens`) : null];
}
function entryBody(e) {
  if (typeof e.body === "string") return unreadable(e.body);
  const body = e.body || {};
  if (e.kind === "summary") { // a compaction: its text is `summary` (agent/transcript.py)
    return [typeof body.summary === "string" ? el("pre", {}, body.summary) : null,
      body.messages_replaced !== undefined ? el("div", { class: "muted small" },
        `replaces ${body.messages_replaced} message(s): ${body.tokens_before} → ${body.tokens_after} tokens`) : null];
  }
  if (e.kind === "tool_result") {
    return [body.code ? el("div", { class: "small" }, "code ", el("code", { class: "result-code" }, String(body.code))) : null,
      body.invocation_id ? el("div", { class: "muted small" }, "receipt ", el("code", {}, body.invocation_id)) : null,
      body.evidence_id ? el("div", { class: "muted small" }, "evidence ", el("code", {}, String(body.evidence_id))) : null,
      body.message ? el("pre", {}, String(body.message)) : null,
      body.result !== undefined ? json(body.result) : null];
  }
  const calls = Array.isArray(body.tool_calls) ? body.tool_calls : [];
  return [typeof body.content === "string" && body.content ? el("pre", {}, body.content) : null,
    calls.length ? el("ul", { class: "calls" }, calls.map((c) => isObject(c) ? el("li", {}, el("code", {}, c.name || "?"),
      c.id ? el("span", { class: "muted" }, ` ${c.id}`) : null, json(c.arguments ?? {}))
      : el("li", {}, unreadable(JSON.stringify(c))))) : null];
}
function entryKey(e) { return `${e.generation ?? 0}/${e.seq}`; }
function renderTranscript(items, more, usage, opened) {
  if (!items.length) return el("p", { class: "muted" }, "The transcript is empty.");
  const total = usage && usage.total; // counted from the model's own usage reports
  return [total && total.calls ? el("p", { class: "muted" }, `${total.calls} model call(s), ${total.prompt_tokens} prompt and ${total.completion_tokens} completion tokens`) : null,
    el("ol", { class: "transcript" }, items.map((e) => el("li", { "data-kind": e.kind, "data-entry": entryKey(e) },
      el("details", { open: opened.has(entryKey(e)) }, el("summary", {}, entryTitle(e)), entryBody(e))))),
    more ? notice(`The first ${items.length} entries are shown; orchestrator tasks transcript prints them all.`) : null];
}

// The Evidence and Transcript sections of the task page `page` ({path, s, here, evidence,
// transcript, opResult}, task.js), read at the page's pace (`loadRecords`).
export function taskRecords(page) {
  const { path, s, here, evidence, transcript, opResult } = page;
  // The evidence, oldest first, a page at a time: the first page, and each "Show more" appends
  // the next (a task with thousands of records came in one answer, ~700 KB, and the page drew
  // ~22,700 elements). A reload reads again as many pages as are shown. The records the
  // report, its findings and the plan's nodes cite that are on no page shown are read by id
  // and listed apart, so every cited id still finds its record on the page.
  const EVIDENCE_PAGE = 100;
  const EVIDENCE_IDS = 50; // cited ids asked for in one request (each is in the address)
  const EVIDENCE_COLUMNS = ["Evidence", "Source", "Origin", "Queried", "Summary", "Reference"];
  const ev = { items: [], cursor: null, pages: 1, cited: [], citedKey: null, read: 0, key: null };
  function evidenceRow(x) {
    // The id is what the report, its findings and the plan's nodes cite: shown, so a cited id
    // can be matched to its record (and its origin) on the page.
    const cells = [x.evidence_id ? el("code", { "data-evidence": x.evidence_id }, x.evidence_id) : "—",
      x.source || "—", x.origin ? badge(x.origin) : "—", when(x.queried_at),
      [x.summary || "—", x.truncated ? el("span", { class: "muted" }, " (truncated)") : null],
      x.content_ref ? el("code", {}, typeof x.content_ref === "string" ? x.content_ref : JSON.stringify(x.content_ref)) : "—"];
    return el("tr", {}, cells.map((cell, i) => el("td", { "data-label": EVIDENCE_COLUMNS[i] }, cell)));
  }
  function evidenceTable(items, id) {
    return el("div", { class: "scroll" }, el("table", { class: "cards", id },
      el("thead", {}, el("tr", {}, EVIDENCE_COLUMNS.map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, items.map(evidenceRow))));
  }
  function citedIds() {
    const ids = new Set();
    const add = (list) => { for (const x of Array.isArray(list) ? list : []) if (typeof x === "string") ids.add(x); };
    const r = s.task && s.task.report;
    if (r) {
      add(r.evidence_refs);
      for (const f of Array.isArray(r.findings) ? r.findings : []) if (isObject(f)) add(f.evidence_ids);
    }
    for (const plan of [s.plan, s.viewing]) if (plan) for (const n of nodesOf(plan)) add(n.evidence_ids);
    return [...ids];
  }
  function drawEvidence() {
    const focused = document.activeElement && document.activeElement.id === "evidence-more";
    const shown = new Set(ev.items.map((x) => x.evidence_id));
    const later = ev.cited.filter((x) => !shown.has(x.evidence_id));
    fill(evidence,
      ev.items.length ? evidenceTable(ev.items, "evidence-list") : el("p", { class: "muted" }, "No evidence recorded."),
      ev.cursor ? el("div", { class: "row" },
        el("button", { type: "button", class: "secondary", id: "evidence-more", onclick: showMoreEvidence }, `Show ${EVIDENCE_PAGE} more`),
        el("span", { class: "muted", id: "evidence-shown" }, `the ${ev.items.length} oldest are shown`)) : null,
      later.length ? [el("h3", { id: "h-evidence-cited" }, "Cited, further on"), evidenceTable(later, "evidence-cited")] : null);
    if (focused && ev.cursor) document.getElementById("evidence-more").focus();
  }
  async function loadEvidence() {
    const read = ++ev.read; // a newer read (or "Show more") wins over this one
    const items = [];
    let cursor = null;
    for (let n = 0; n < ev.pages; n += 1) {
      const query = new URLSearchParams({ limit: String(EVIDENCE_PAGE) });
      if (cursor) query.set("cursor", cursor);
      const result = await watched(s.held, `${path}/evidence?${query}`);
      if (!here() || read !== ev.read) return;
      if (!result.ok) {
        if (!result.down) fill(evidence, notice(missingRoute(result) ? "Not available on this server." : errorText(result)));
        return;
      }
      items.push(...itemsOf(result.data));
      cursor = result.data.next_cursor || null;
      if (!cursor) break;
    }
    const last = items[items.length - 1];
    const key = `${items.length}:${last ? last.evidence_id : ""}:${cursor}`;
    ev.items = items;
    ev.cursor = cursor;
    ev.loaded = true;
    if (key !== ev.key) { ev.key = key; drawEvidence(); }
    loadCited();
  }
  async function showMoreEvidence() {
    const button = document.getElementById("evidence-more");
    if (button) button.disabled = true;
    ev.pages += 1; // a reload that starts meanwhile reads this page too
    const read = ++ev.read;
    const query = new URLSearchParams({ limit: String(EVIDENCE_PAGE), cursor: ev.cursor });
    const result = await api("GET", `${path}/evidence?${query}`);
    if (!here() || read !== ev.read) return;
    if (!result.ok) {
      ev.pages -= 1;
      if (button) button.disabled = false;
      fill(opResult, el("span", { class: "error" }, errorText(result)));
      return;
    }
    const page = itemsOf(result.data);
    ev.cursor = result.data.next_cursor || null;
    const list = document.querySelector("#evidence-list tbody");
    ev.items.push(...page);
    const last = ev.items[ev.items.length - 1];
    ev.key = `${ev.items.length}:${last ? last.evidence_id : ""}:${ev.cursor}`;
    const shown = new Set(page.map((x) => x.evidence_id));
    if (list && ev.cursor && !ev.cited.some((x) => shown.has(x.evidence_id))) {
      // Appended where the list is: the rows shown, and the button, stay as they are.
      append(list, page.map(evidenceRow));
      fill(document.getElementById("evidence-shown"), `the ${ev.items.length} oldest are shown`);
      button.disabled = false;
    } else drawEvidence();
  }
  // The cited records on no page shown, read by id (once: a record never changes).
  async function loadCited() {
    if (!ev.loaded) return;
    const shown = new Set(ev.items.map((x) => x.evidence_id));
    const wanted = ev.cursor ? citedIds().filter((id) => !shown.has(id)) : [];
    const key = wanted.join("\n");
    if (key === ev.citedKey) return;
    ev.citedKey = key;
    const have = new Map(ev.cited.map((x) => [x.evidence_id, x]));
    const missing = wanted.filter((id) => !have.has(id));
    const found = wanted.filter((id) => have.has(id)).map((id) => have.get(id));
    for (let i = 0; i < missing.length; i += EVIDENCE_IDS) {
      const chunk = missing.slice(i, i + EVIDENCE_IDS);
      const query = new URLSearchParams({ limit: String(EVIDENCE_IDS) });
      for (const id of chunk) query.append("id", id);
      const result = await api("GET", `${path}/evidence?${query}`);
      if (!here() || key !== ev.citedKey) return;
      if (!result.ok) { ev.citedKey = null; return; } // asked again at the next reload
      const asked = new Set(chunk); // a server that ignores `id` answers other records
      found.push(...itemsOf(result.data).filter((x) => asked.has(x.evidence_id)));
    }
    ev.cited = found;
    drawEvidence();
  }
  // The transcript, oldest first, read a page at a time up to TRANSCRIPT_PAGES pages; it is
  // drawn again only when it grew. A read answered after a newer one is not drawn (as for the
  // evidence): it took the newer entries away, on a running task whose writes each read it.
  async function loadTranscript() {
    const asked = ++s.transcriptAsked;
    const items = [];
    let cursor = null, more = false, usage = null;
    for (let n = 0; n < TRANSCRIPT_PAGES; n += 1) {
      const query = new URLSearchParams({ limit: String(TRANSCRIPT_PAGE) });
      if (cursor) query.set("cursor", cursor);
      const result = await watched(s.held, `${path}/transcript?${query}`);
      if (!here() || asked < s.transcriptDrawn) return;
      if (!result.ok) {
        if (!result.down) fill(transcript, notice(missingRoute(result) ? "Not available on this server." : errorText(result)));
        return;
      }
      items.push(...itemsOf(result.data));
      usage = result.data.token_usage || null;
      cursor = result.data.next_cursor;
      more = Boolean(cursor);
      if (!more) break;
    }
    const last = items[items.length - 1];
    const key = `${items.length}:${last ? `${last.generation}/${last.seq}` : ""}:${more}`;
    s.transcriptDrawn = asked;
    if (key === s.transcriptKey) return;
    s.transcriptKey = key;
    // Drawn again because it grew (a running task): the entries a person opened stay open.
    const opened = new Set([...transcript.querySelectorAll("li[data-entry] > details[open]")]
      .map((d) => d.parentElement.getAttribute("data-entry")));
    fill(transcript, renderTranscript(items, more, usage, opened));
  }

  function loadRecords() {
    loadEvidence();
    loadTranscript();
  }
  return { loadRecords, loadCited };
}
