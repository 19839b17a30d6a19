/* The operator console: plain JavaScript, no framework, no build step.
 *
 * Everything the model or an operator wrote (titles, plans, reports, payloads, transcripts) is
 * put into the page as text nodes (textContent), never as HTML, by `append` (and `shown` for
 * the few attributes and SVG text a person reads): both draw each bidirectional control and
 * zero-width character as a visible marker instead of letting it reorder or hide the text. Calls go to the API of the same
 * origin with the session cookie; writes carry X-Orch-Console: 1. Routes that a server may not
 * have yet (evidence, transcript, task stream, human nodes) show "not available on this server"
 * when they answer 404.
 *
 * The session names an account (GET console/session): the header shows who is signed in, and
 * what the role cannot do is not offered (a viewer only reads, an operator does not decide on
 * actions). The API refuses it all the same; the page only spares a click that would fail. A
 * named account acts as itself: the API records its name as `by`, so no name is asked for.
 *
 * Answers come late and out of order on a slow API: a view draws only while the address still
 * names it (`shownAt`), and not an answer older than one it already drew; a write's buttons
 * wait, disabled and marked "sending…", for its answer (`sendOnce`), so a second click does not
 * send it again, and a form drawn again meanwhile waits too (`stillSending`).
 */
"use strict";

(function () {
  const FINAL_STATUSES = new Set(["completed", "failed", "cancelled"]);
  const API = "api/v1/";
  const STATUSES = ["queued", "running", "waiting", "completed", "failed", "cancelled"];
  const TERMINAL = ["completed", "failed", "cancelled"];
  const NODE_DONE = ["completed", "failed", "skipped", "cancelled"];
  const POLL_MS = 3000;
  const STEP_TEXT_MAX = 1500; // a human step's evidence or reason, as the API takes it
  const main = document.getElementById("main");
  const banner = document.getElementById("banner");
  let view = null; // the current view's {dispose}
  let me = null; // the signed-in account {name, role, shared}; null when unknown
  const ROLES = ["viewer", "operator", "approver"];

  // ---- untrusted text: what would reorder or hide it is shown ---------------------------
  // A bidirectional control makes text read otherwise than it is ("Trojan Source"): after a
  // right-to-left override, "abc\u202Edcba" is drawn "abcabcd". Isolating the string
  // (unicode-bidi: isolate, <bdi>) keeps it from its neighbours but not from itself, so every
  // such character (the Bidi_Control set, the zero-width and invisible format characters, the
  // invisible tag characters) becomes a marker, ⟦U+202E⟧, in a style of its own and named in
  // its tooltip. Copying the text copies the marker, not the control; the API and the CLI
  // still give the text as stored.
  const HIDDEN = /[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]|\udb40[\udc00-\udc7f]/g;
  const HIDDEN_NAMES = {
    0x061c: "ARABIC LETTER MARK", 0x200b: "ZERO WIDTH SPACE", 0x200c: "ZERO WIDTH NON-JOINER",
    0x200d: "ZERO WIDTH JOINER", 0x200e: "LEFT-TO-RIGHT MARK", 0x200f: "RIGHT-TO-LEFT MARK",
    0x202a: "LEFT-TO-RIGHT EMBEDDING", 0x202b: "RIGHT-TO-LEFT EMBEDDING",
    0x202c: "POP DIRECTIONAL FORMATTING", 0x202d: "LEFT-TO-RIGHT OVERRIDE",
    0x202e: "RIGHT-TO-LEFT OVERRIDE", 0x2060: "WORD JOINER", 0x2061: "FUNCTION APPLICATION",
    0x2062: "INVISIBLE TIMES", 0x2063: "INVISIBLE SEPARATOR", 0x2064: "INVISIBLE PLUS",
    0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE", 0x2068: "FIRST STRONG ISOLATE",
    0x2069: "POP DIRECTIONAL ISOLATE", 0xfeff: "ZERO WIDTH NO-BREAK SPACE",
  };
  // Elements whose content is text only: the marker goes in without its style.
  const TEXT_ONLY = new Set(["option", "textarea", "title"]);
  function codePoint(char) {
    return `U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
  }
  function marker(char) { return `\u27e6${codePoint(char)}\u27e7`; } // ⟦U+202E⟧
  function shown(text) {
    // `text` with each hidden character as its marker: for attributes and SVG text.
    return String(text).replace(HIDDEN, marker);
  }
  function textNodes(text) {
    // A text node, or the text's pieces around a styled marker for each hidden character.
    // `search`, not `test`: a global pattern's `test` moves its lastIndex, where matchAll starts.
    if (text.search(HIDDEN) < 0) return document.createTextNode(text);
    const pieces = document.createDocumentFragment();
    let from = 0;
    for (const match of text.matchAll(HIDDEN)) {
      if (match.index > from) pieces.appendChild(document.createTextNode(text.slice(from, match.index)));
      const char = match[0];
      const name = HIDDEN_NAMES[char.codePointAt(0)] || "TAG CHARACTER";
      pieces.appendChild(el("span", { class: "control-char",
        title: `${codePoint(char)} ${name}: an invisible character in the text, shown here` }, marker(char)));
      from = match.index + char.length;
    }
    if (from < text.length) pieces.appendChild(document.createTextNode(text.slice(from)));
    return pieces;
  }

  // ---- DOM helpers: text only ------------------------------------------------------------
  // Attributes a person reads (tooltips, labels) show hidden characters too; the others
  // (ids, values sent back to the API) are data and are kept as they are.
  const READ_ATTRIBUTES = new Set(["title", "aria-label", "placeholder", "alt"]);
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") {
        node.addEventListener(key.slice(2), value);
      } else if (key === "text") {
        fill(node, value);
      } else {
        const text = value === true ? "" : String(value);
        node.setAttribute(key, READ_ATTRIBUTES.has(key) ? shown(text) : text);
      }
    }
    append(node, children);
    return node;
  }
  function append(node, children) {
    const textOnly = TEXT_ONLY.has(node.localName);
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child
        : textOnly ? document.createTextNode(shown(child)) : textNodes(String(child)));
    }
    return node;
  }
  function fill(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }
  function badge(status, markOpen) {
    // Receipts mark `unknown` and `pending`: a write whose effect nobody has confirmed.
    const marked = Boolean(markOpen) && (status === "unknown" || status === "pending");
    return el("span", { class: `badge s-${status}${marked ? " marked" : ""}` },
      marked ? `⚠ ${status}` : String(status));
  }
  // ---- times: their zone, and the server's clock ---------------------------------------
  // A time read `12/6/2026, 5:20:00 PM`, in a zone it did not name, and what is past or ahead
  // was judged by the browser's clock, which may be hours adrift: a dispatcher's hold for ten
  // more minutes read as run out (Retry offered, the API refusing it), "last hour" listed
  // nothing. A time is shown in the browser's zone, named (`2026-12-06 17:20:00 GMT+8`; its
  // tooltip in UTC), with how long ago or ahead it is by the server's clock: every API answer's
  // `Date` header. That header is whole seconds (uvicorn writes it once a second), read
  // before the answer left, so each sample is at most the server's lead on the browser and
  // within two seconds of it; the largest of the recent ones is the nearest, and half a
  // second is added for the seconds cut off. A few seconds either way read "just now".
  const leads = [];
  let lead = 0; // ms the server's clock is ahead of the browser's
  function sampleClock(response) {
    const at = Date.parse(response.headers.get("Date") || "");
    if (Number.isNaN(at)) return;
    leads.push(at - Date.now());
    if (leads.length > 10) leads.shift(); // a browser clock set right meanwhile is followed
    lead = Math.max(...leads) + 500;
  }
  function now() { return Date.now() + lead; }
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  function zoneOf(date, timeZone) {
    try {
      const part = new Intl.DateTimeFormat("en-US", { timeZone, timeZoneName: "short" })
        .formatToParts(date).find((x) => x.type === "timeZoneName");
      return part ? part.value : "local time";
    } catch (_) { return "local time"; }
  }
  function stamp(date, utc) {
    const [y, mo, d, h, mi, sec] = utc
      ? [date.getUTCFullYear(), date.getUTCMonth(), date.getUTCDate(), date.getUTCHours(), date.getUTCMinutes(), date.getUTCSeconds()]
      : [date.getFullYear(), date.getMonth(), date.getDate(), date.getHours(), date.getMinutes(), date.getSeconds()];
    return `${pad(y, 4)}-${pad(mo + 1)}-${pad(d)} ${pad(h)}:${pad(mi)}:${pad(sec)} ${utc ? "UTC" : zoneOf(date)}`;
  }
  // "3 min ago", "in 10 min": from the server's now, the larger unit only.
  function howFar(date) {
    const ms = date.getTime() - now();
    const s = Math.floor(Math.abs(ms) / 1000);
    if (s < 3) return "just now";
    const size = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min`
      : s < 48 * 3600 ? `${Math.floor(s / 3600)} h` : `${Math.floor(s / 86400)} d`;
    return ms > 0 ? `in ${size}` : `${size} ago`;
  }
  function when(value) {
    if (!value) return "—";
    const date = new Date(value);
    if (Number.isNaN(date.getTime())) return String(value);
    return el("time", { datetime: String(value), title: stamp(date, true) },
      el("span", { class: "stamp" }, stamp(date, false)), " ", el("span", { class: "far" }, `(${howFar(date)})`));
  }
  // How far each time shown is, kept true as the clock runs (nothing else redraws an idle page).
  setInterval(() => {
    for (const far of document.querySelectorAll("time[datetime] > span.far")) {
      const text = `(${howFar(new Date(far.parentElement.getAttribute("datetime")))})`;
      if (far.textContent !== text) far.textContent = text;
    }
  }, 5000);
  function lastWrite(value) {
    if (value === undefined) return undefined; // a server without `last_write`: no row
    if (!value) return "none in this generation";
    if (typeof value !== "object") return String(value);
    const at = value.at || value.time || value.written_at || value.created_at;
    return [value.kind || "write", " ", at ? when(at) : ""];
  }
  // A `running` task whose generation its worker handed back (a model server's Retry-After,
  // an outage): no round runs until the sweeper requeues it, after `requeue_after`.
  function handedBack(task, id) {
    const wait = task.handed_back;
    if (!wait) return null;
    return el("span", { class: "handed-back", id: id || null, title: wait.reason || "" },
      " handed back", wait.requeue_after ? [", requeued after ", when(wait.requeue_after)] : "");
  }
  // Queued, and no worker was woken: the broker refused its wake-up (`wake_up_unsent`), and the
  // task does not move until the sweeper sends it. The list said a plain "queued" of it.
  function wakeUpUnsent(task, id) {
    if (!task.wake_up_unsent) return null;
    const why = "the sweeper sends it once Redis takes messages again";
    return id ? el("span", { class: "muted", id }, ` wake-up not sent (Redis refused it); ${why}`)
      : el("span", { class: "muted wake-up-unsent", title: why }, " wake-up not sent (Redis refused it)");
  }
  function facts(pairs) {
    return el("dl", { class: "facts" },
      pairs.filter(([, v]) => v !== undefined).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "—")]));
  }
  function json(value) {
    return el("pre", {}, JSON.stringify(value, null, 2));
  }
  // A part of a record an older version stored in another shape: the API sends it as its JSON
  // text (api/older_shapes.py), shown as written and marked, never read as today's shape.
  function unreadable(text) {
    return el("pre", { class: "unreadable", title: "stored by an older version in another shape" }, String(text));
  }
  function isObject(value) { return value !== null && typeof value === "object" && !Array.isArray(value); }
  // The nodes and edges of a plan that have today's shape (the others are text).
  function nodesOf(plan) { return (plan.nodes || []).filter(isObject); }
  function edgesOf(plan) { return (plan.edges || []).filter(isObject); }
  function notice(text) {
    return el("p", { class: "notice" }, text);
  }
  function table(columns, rows, cls) {
    return el("div", { class: "scroll" }, el("table", { class: cls || "cards" },
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, rows.map((cells) => el("tr", {},
        cells.map((cell, i) => el("td", { "data-label": columns[i] }, cell)))))));
  }
  function itemsOf(data) {
    if (!data) return [];
    for (const key of ["items", "tasks", "sessions", "actions", "evidence", "messages"]) {
      if (Array.isArray(data[key])) return data[key];
    }
    return Array.isArray(data) ? data : [];
  }

  // ---- task detail pieces ----------------------------------------------------------------
  const TRANSCRIPT_PAGE = 200;
  const TRANSCRIPT_PAGES = 5; // at most 1000 entries on the page; the CLI prints them all
  function lostGenerations(task) {
    // `recoveries` counts losses in a row of workers that died, `handbacks` of generations
    // handed back after an outage (both reset when a generation ends otherwise): the parking
    // rules. The executions show every loss.
    const lost = (task.executions || []).filter((x) => x.outcome === "lost").length;
    const row = [];
    if (task.recoveries) row.push(`${task.recoveries} in a row`);
    if (task.handbacks) row.push(`${task.handbacks} handed back after outages in a row`);
    return row.length ? `${lost} (${row.join(", ")})` : String(lost);
  }
  // A cited evidence id, as a link to its record in the task's Evidence section: the record is
  // there even when it falls on a page not shown (the task page reads cited records by id).
  function citation(id) {
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
  function finding(f) {
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

  // ---- the API ---------------------------------------------------------------------------
  function showBanner(text) {
    if (text) { fill(banner, text); banner.hidden = false; }
    else if (!banner.hidden) { banner.hidden = true; fill(banner); }
  }
  async function api(method, path, body, signal, tag) {
    const init = { method, credentials: "same-origin", headers: { "X-Orch-Console": "1" }, signal };
    if (tag) {
      // The answer held is sent again only if it changed (304 otherwise, with no body).
      init.headers["If-None-Match"] = tag;
      init.cache = "no-store";
    }
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(API + path, init);
    } catch (error) {
      if (error && error.name === "AbortError") throw error;
      showBanner("The API is not answering; retrying…");
      return { ok: false, status: 0, data: null, down: true };
    }
    sampleClock(response);
    showBanner("");
    if (response.status === 401) {
      // The session ended: back to the sign-in form, at this view's address, which it keeps
      // through the sign-in (signin.js); a query (?sign_in_refused=...) is not kept.
      if (location.search) location.assign(location.pathname + location.hash);
      else location.reload();
      return { ok: false, status: 401, data: null };
    }
    if (response.status === 304) return { ok: false, status: 304, data: null, tag: response.headers.get("ETag") };
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    return { ok: response.ok, status: response.status, data, tag: response.headers.get("ETag") };
  }
  // A GET polled again and again: the tag and answer held of each path (in `held`, a Map the
  // view owns) are sent as If-None-Match; a 304 gives back the answer held, marked unchanged.
  async function watched(held, path) {
    const had = held.get(path);
    const result = await api("GET", path, undefined, undefined, had ? had.tag : null);
    if (result.status === 304 && had) return { ok: true, status: 200, data: had.data, unchanged: true };
    if (result.ok && result.tag) held.set(path, { tag: result.tag, data: result.data });
    else held.delete(path);
    return result;
  }
  // A write is sent once per click: the buttons of the form that sends it (or the button) are
  // disabled until its answer, and "sending…" beside them says why. On a slow API a second
  // click sent it again: a requeue clicked twice made two generations, the first superseded for
  // nothing. Null while one is on its way. `key` names the write when its form may be drawn
  // again before the answer (the human step's, on a poll or the stream): the form drawn anew
  // waits too (`stillSending`), and all of them are let go at the answer.
  const sending = new Map(); // key -> the controls drawn for that write while it is on its way
  const sendingNotes = new WeakMap();
  function holdControl(control, on) {
    const buttons = control.matches("button") ? [control] : [...control.querySelectorAll("button")];
    for (const button of buttons) button.disabled = on;
    sendingNotes.get(control)?.remove();
    sendingNotes.delete(control);
    if (!on) return;
    const note = el("span", { class: "sending muted", role: "status" }, " sending…");
    sendingNotes.set(control, note);
    if (control.matches("button")) control.after(note); else control.appendChild(note);
  }
  async function sendOnce(control, method, path, body, key = control) {
    if (!control || sending.has(key)) return null;
    const drawn = new Set([control]);
    sending.set(key, drawn);
    holdControl(control, true);
    try { return await api(method, path, body); } finally {
      sending.delete(key);
      for (const each of drawn) holdControl(each, false);
    }
  }
  function stillSending(control, key) {
    const drawn = sending.get(key);
    if (drawn) { drawn.add(control); holdControl(control, true); }
    return control;
  }
  function errorText(result) {
    if (result.down) return "The API is not answering.";
    const error = result.data && result.data.error;
    if (result.status === 404 && (!error || error.message === "Not Found")) {
      return "Not available on this server.";
    }
    if (!error) return `HTTP ${result.status}`;
    const detail = Array.isArray(error.details) && error.details[0];
    const more = detail && detail.message && detail.message !== error.message
      ? `: ${detail.field ? `${String(detail.field).replace(/^query\./, "")}: ` : ""}${detail.message}` : "";
    return `${error.message}${more} (${error.code})`;
  }
  // A read that failed (refused, or the network dropped), said where its content goes, with a
  // button that reads it again: a section left empty read as "nothing there".
  function readFailed(id, what, result, again) {
    const text = `${what} could not be read: ${errorText(result).replace(/\.$/, "")}. `;
    return el("p", { class: "error read-failed", id, role: "alert" }, text,
      el("button", { type: "button", class: "secondary", onclick: (event) => {
        event.currentTarget.disabled = true; // until the read's answer draws this again
        again();
      } }, "Retry"));
  }
  function missingRoute(result) {
    // No such route: FastAPI's own 404 ("Not Found"), or a path that exists for other methods.
    const error = result.data && result.data.error;
    return result.status === 405 || (result.status === 404 && (!error || error.message === "Not Found"));
  }

  // ---- who is signed in ---------------------------------------------------------------
  function can(role) {
    // Unknown (the session answer failed): offer everything; the API decides.
    return !me || ROLES.indexOf(me.role) >= ROLES.indexOf(role);
  }
  function named() { return Boolean(me && !me.shared); }
  function cannot(role, what) {
    return el("p", { class: "notice role-note" },
      `Signed in as ${me ? me.name : "?"} (${me ? me.role : "?"}): ${what} needs the ${role} role.`);
  }
  function operator() { return localStorage.getItem("orch.by") || ""; }
  // The values typed into a form's text fields and which of them had the focus, to put back
  // after the form is drawn again (hidden fields are the console's own, not typed).
  function typedIn(box) {
    const fields = [...box.querySelectorAll("input[id]:not([type=hidden]), textarea[id]")];
    const active = fields.includes(document.activeElement) ? document.activeElement : null;
    return {
      values: Object.fromEntries(fields.map((f) => [f.id, f.value])),
      focused: active ? { id: active.id, start: active.selectionStart, end: active.selectionEnd } : null,
    };
  }
  function restoreTyped(box, typed) {
    for (const field of box.querySelectorAll("input[id]:not([type=hidden]), textarea[id]")) {
      if (Object.hasOwn(typed.values, field.id)) field.value = typed.values[field.id];
    }
    const again = typed.focused && document.getElementById(typed.focused.id);
    if (again && box.contains(again)) {
      again.focus();
      if (typed.focused.start !== null) again.setSelectionRange(typed.focused.start, typed.focused.end);
    }
  }
  function byField(id) {
    // A named account acts as itself (the API records its name); the shared token asks.
    if (named()) {
      return [el("input", { type: "hidden", id, name: "by", value: me.name }),
        el("p", { class: "muted acting-as" }, `Acting as ${me.name}`)];
    }
    return [el("label", { for: id }, "Your name"),
      el("input", { id, name: "by", required: true, maxlength: 128, value: operator(), autocomplete: "name" })];
  }
  function remember(by) { if (by && !named()) localStorage.setItem("orch.by", by); }
  function showAccount(state) {
    document.getElementById("signout").hidden = !state.required;
    const who = document.getElementById("whoami");
    if (!state.required || !me) { who.hidden = true; return; }
    fill(who, me.shared ? "Signed in with the API token" : ["Signed in as ", el("strong", { id: "whoami-name" }, me.name)],
      el("span", { class: "role", id: "whoami-role" }, me.role));
    who.hidden = false;
  }

  // ---- routing -------------------------------------------------------------------------
  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    return { path, params: new URLSearchParams(query || "") };
  }
  // The task a `#/task/ID` address names, or null.
  function taskOf(path) {
    const task = path.match(/^\/task\/([^/]+)$/);
    if (!task) return null;
    // A mistyped link ("%ZZ") is not valid percent-encoding: taken as typed, it is said to be
    // no task, where decoding it threw and left the previous page up.
    try { return decodeURIComponent(task[1]); } catch (error) { return task[1]; }
  }
  // The addresses of the views other than a task's page ("#/" and "" are the task list).
  const VIEWS = ["/", "/deliveries", "/approvals"];
  // Which view the address names (its query aside: a task page keeps its revision and node
  // there, and a new filter opens the view afresh).
  function viewKey() {
    const { path } = route();
    const task = taskOf(path);
    return task !== null ? `task:${task}` : VIEWS.includes(path) ? path : `unknown:${path}`;
  }
  // Whether the view opened as `key` is still the one the address names. A hash-only
  // navigation changes the address at once but tells the page (`hashchange`, which disposes
  // the view) a task later: an answer of the view left that landed in between was drawn, and
  // the task page then wrote its own address back over the new one (keepInAddress), so the
  // view the operator asked for never showed. Every view checks this before it draws.
  function shownAt(key) { return viewKey() === key; }
  function render() {
    if (view && view.dispose) view.dispose();
    view = null;
    showBanner("");
    const { path, params } = route();
    document.getElementById("nav-tasks").toggleAttribute("aria-current", false);
    document.getElementById("nav-approvals").toggleAttribute("aria-current", false);
    document.getElementById("nav-deliveries").toggleAttribute("aria-current", false);
    const task = taskOf(path);
    if (task !== null) {
      view = taskDetail(task, params);
    } else if (path === "/deliveries") {
      document.getElementById("nav-deliveries").setAttribute("aria-current", "page");
      view = deliveryList(params);
    } else if (path === "/approvals") {
      document.getElementById("nav-approvals").setAttribute("aria-current", "page");
      view = approvals();
    } else if (path === "/") {
      document.getElementById("nav-tasks").setAttribute("aria-current", "page");
      view = taskList(params);
    } else {
      view = noSuchPage(path);
    }
  }
  // A mistyped or stale address drew the task list, unsaid, as if it were what was asked for.
  function noSuchPage(path) {
    fill(main, el("h1", {}, "No such page"),
      el("p", { id: "no-such-page" }, "The console has no page at ", el("code", {}, `#${path}`), ". ",
        el("a", { href: "#/" }, "Back to the tasks")));
    return null;
  }

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

  function taskList(params) {
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
      if (location.hash === hash) render(); else location.hash = hash; // again: a fresh range
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

  function planGraph(plan, selected, onSelect) {
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
  function olderParts(plan) {
    const parts = [...(plan.nodes || []), ...(plan.edges || [])].filter((p) => !isObject(p));
    return parts.length ? el("div", { id: "plan-older" }, el("p", { class: "notice" },
      `${parts.length} node(s) or edge(s) stored by an older version in another shape, as written:`),
      parts.map(unreadable)) : null;
  }
  function countsOf(plan) {
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
  function retriesIn(plan, node) {
    const byId = new Map(nodesOf(plan).map((n) => [n.id, n]));
    const ids = (isObject(plan.retries) && Array.isArray(plan.retries[node.id])) ? plan.retries[node.id] : [];
    return ids.map((id) => byId.get(id)).filter((n) => n);
  }

  // ---- deliveries (the outbox) -----------------------------------------------------------
  // A dead-lettered delivery waits for an operator (a task's later events wait behind it): it
  // is sent again, with fresh counts, by POST /api/v1/outbox/{id}/retry.
  function retryButton(row, say, after) {
    // Keyed: the list redrawn by a poll while it is on its way draws the button waiting too.
    const key = `retry:${row.outbox_id}`;
    return stillSending(el("button", { type: "button", class: "secondary", "data-retry": String(row.outbox_id), onclick: async (event) => {
      // The shared token's retry is recorded by the name this browser signs discards with, if
      // it has one (`retried_by`); it read `api`. An account is recorded by its own name.
      const by = named() ? "" : operator();
      const result = await sendOnce(event.currentTarget, "POST", `outbox/${encodeURIComponent(row.outbox_id)}/retry`, by ? { by } : undefined, key);
      if (!result) return;
      if (result.ok) { fill(say, `Delivery ${row.outbox_id} is due again.`); after(); }
      else { fill(say, el("span", { class: "error" }, refusedText(row.outbox_id, result, "retry"))); if (beingSent409(result)) after(); }
    } }, "Retry"), key);
  }
  // Every dead letter (of the kind shown) due again at once, once the backend or a secret
  // rotated on one side is mended: POST /api/v1/outbox/retry-dead (`outbox retry --all-dead`).
  function retryEveryButton(kind, task, say, after) {
    const what = kind === "action" ? "approved action" : kind === "webhook" ? "task event" : "";
    return el("button", { type: "button", class: "secondary", id: "retry-every-dead", onclick: async (event) => {
      const body = {};
      if (kind) body.kind = kind;
      if (task) body.task_id = task; // the task's only, as listed
      const result = await sendOnce(event.currentTarget, "POST", "outbox/retry-dead", body);
      if (!result) return;
      if (result.ok) { fill(say, `${result.data.retried} dead ${what ? what + " " : ""}deliveries are due again.`); after(); }
      else fill(say, el("span", { class: "error" }, errorText(result)));
    } }, `Retry every dead ${what ? what + " " : ""}delivery`);
  }
  // Every pending delivery (of the kind and task shown) that failed and backs off, due now with
  // its counts kept, once the backend is mended after an outage: POST
  // /api/v1/outbox/retry-failing (`outbox retry --all-failing`). Asked first, in the page: it
  // sends at once what may be many rows to a backend just back. One a dispatcher is sending
  // is left to it (`being_sent`), and said.
  function retryFailingBox(kind, task, say, after) {
    const what = kind === "action" ? "approved action " : kind === "webhook" ? "task event " : "";
    const box = el("div", { class: "row", id: "retry-failing" });
    const plural = (n, one, many) => (n === 1 ? one : many);
    function ask() {
      const confirm = el("div", { class: "row", id: "retry-failing-confirm", role: "group" },
        el("span", {}, `Send every ${what}delivery that failed and backs off now, its counts kept?`,
          task ? [" Of task ", el("code", {}, task), " only."] : ""),
        el("button", { type: "button", class: "secondary", onclick: async (event) => {
          const body = {};
          if (kind) body.kind = kind;
          if (task) body.task_id = task;
          const result = await sendOnce(event.currentTarget.parentElement, "POST", "outbox/retry-failing", body);
          if (!result) return;
          confirm.remove();
          if (!result.ok) { fill(say, el("span", { class: "error" }, errorText(result))); return; }
          const { retried, being_sent: sending } = result.data;
          fill(say, `${retried} failing ${what}${plural(retried, "delivery is", "deliveries are")} due now.`,
            sending ? ` ${sending} being sent now ${plural(sending, "is left to its dispatcher: retry it once its answer is in, if it failed.",
              "are left to their dispatchers: retry them once their answers are in, if they failed.")}` : "");
          after();
        } }, "Retry them"),
        el("button", { type: "button", class: "secondary", onclick: () => { confirm.remove(); button.focus(); } }, "Cancel"));
      document.getElementById("retry-failing-confirm")?.remove();
      box.appendChild(confirm);
      confirm.querySelector("button").focus();
    }
    const button = el("button", { type: "button", class: "secondary", id: "retry-every-failing", onclick: ask },
      `Retry every failing ${what}delivery`);
    box.appendChild(button);
    return box;
  }
  // A dead letter the operator dealt with by hand (the backend will never take it) is
  // discarded, saying why: never sent again, and the task's later events go on. The row keeps
  // who, when and why (POST /api/v1/outbox/{id}/discard).
  function discardForm(row, say, after) {
    const id = row.outbox_id;
    const reason = el("input", { id: `discard-reason-${id}`, name: "reason", required: true, maxlength: 500, placeholder: "how it was dealt with" });
    const byId = `discard-by-${id}`, key = `discard:${id}`;
    return stillSending(el("form", { class: "inline discard", "data-discard": String(id), onsubmit: async (event) => {
      event.preventDefault();
      const form = event.currentTarget;
      const by = document.getElementById(byId).value.trim();
      if (!by) { fill(say, el("span", { class: "error" }, "Your name is needed.")); return; }
      if (!reason.value.trim()) { fill(say, el("span", { class: "error" }, "A reason is needed.")); return; }
      remember(by);
      const result = await sendOnce(form, "POST", `outbox/${encodeURIComponent(id)}/discard`, { reason: reason.value.trim(), by }, key);
      if (!result) return;
      if (result.ok) {
        fill(say, row.kind === "action"
          ? `Delivery ${id} is discarded: approved action ${row.action_id} will not be sent.`
          : `Delivery ${id} is discarded: the task's later events go on.`);
        after();
      } else { fill(say, el("span", { class: "error" }, refusedText(id, result, "discard"))); if (beingSent409(result)) after(); }
    } }, el("div", {}, byField(byId)),
    el("div", {}, el("label", { for: reason.id }, "Discard reason"), reason),
    el("button", { type: "submit", class: "danger" }, "Discard")), key);
  }
  // A dispatcher sending the row (`409 being_sent`): its answer may yet deliver it, so the
  // retry or discard waits for that answer. Said as such, not as a generic error; the view is
  // read again, so the row says "being sent now" and offers nothing until the answer is in.
  function beingSent409(result) {
    return result.status === 409 && Boolean(result.data && result.data.error && result.data.error.code === "being_sent");
  }
  function refusedText(id, result, what) {
    if (!beingSent409(result)) return errorText(result);
    // Posted now, or claimed in a dispatcher's batch and waiting its turn (the API says which).
    const waiting = /waits its turn/.test(String(result.data.error.message || ""));
    return waiting
      ? `Delivery ${id} is claimed by a dispatcher and waits its turn in its batch: its answer is recorded when the attempt ends; ${what} it then if it failed.`
      : `Delivery ${id} is being sent now: its answer is recorded when the attempt ends; ${what} it then if it failed.`;
  }
  // A dispatcher holds a pending row while it sends it (`claimed_until`, in the future): a
  // time past is a dispatcher that stopped mid-send, and the row is due again.
  function isBeingSent(x) {
    return x.status === "pending" && Boolean(x.claimed_until) && new Date(x.claimed_until).getTime() > now();
  }
  // What of the rows shown changes with the clock alone: a claim's hold runs out (a dispatcher
  // stopped mid-send: due again), a backoff ends. The list's tag and its rows stay the same
  // then, so a view drawn once kept saying "being sent now", with no Retry, until a reload.
  function deliveryClock(rows) {
    return (rows || []).map((x) => `${isBeingSent(x) ? 1 : 0}${isFailing(x) ? 1 : 0}`).join();
  }
  // A dispatcher claims a batch of rows and posts them one after another, recording when it
  // posts each (`sending_since`): the others of the batch wait their turn, held as well. Every
  // row of a batch read "being sent now". (A dispatcher older than `sending_since` records no
  // post: its rows read as waiting their turn.)
  function beingSentNow(x) {
    return x.sending_since
      ? el("span", { class: "being-sent" }, "being sent now (attempt ", String(x.attempts), ", held until ",
        when(x.claimed_until), ", posted at ", when(x.sending_since), ")")
      : el("span", { class: "being-sent waiting-turn" }, "claimed by a dispatcher: waits its turn in its batch (attempt ",
        String(x.attempts), ", held until ", when(x.claimed_until), ")");
  }
  // A pending row that failed and waits out its backoff (its next attempt ahead), not held in
  // order behind another: the API retries it (due now, its counts kept) or discards it, as
  // `outbox retry N` and `outbox discard N` do, and as `actions show` and `tasks show` name
  // them. An approved action is retried until a 2xx, so one the backend answers 500 for
  // every time was offered nothing here. One due now (just retried) waits for its dispatcher.
  function isFailing(x) {
    return x.status === "pending" && Boolean(x.attempts || x.last_error) && !x.waits_behind && !x.waits_behind_retried
      && Boolean(x.next_attempt_at) && new Date(x.next_attempt_at).getTime() > now();
  }
  // What is done about a dead letter or a failing delivery: retried, or discarded; one being
  // sent offers neither (the API refuses both, `409 being_sent`).
  function deadControls(x, say, after) {
    return (x.status === "dead" || isFailing(x)) && !isBeingSent(x) && can("operator") ? [retryButton(x, say, after), discardForm(x, say, after)] : "";
  }
  // Who last retried the row (or hurried it, pending), when, and their note.
  // A retry recorded without a name (`retried_by` null) was not shown at all.
  function retriedBy(x) {
    return x.retried_by || x.retried_at ? el("p", { class: "muted retried" },
      `retried by ${x.retried_by || "an unrecorded name"} `, when(x.retried_at),
      x.retry_note ? `: ${x.retry_note}` : "") : null;
  }
  // A row discarded while pending was never dead-lettered (`discarded_from`): its status says
  // so, where a bare "discarded" read as a dead letter settled by hand.
  function deliveryStatus(x) {
    return [badge(x.status), x.status === "discarded" && x.discarded_from === "pending"
      ? el("span", { class: "discarded-from" }, " while pending") : null];
  }
  // Why a dead (or discarded) row was dead-lettered (`dead_reason`): its last error alone,
  // `HTTP 503`, read as one more failure the dispatcher would retry. Failed attempts are the
  // attempts less the throttled ones, as `outbox list` counts them. A refusal's error says it
  // already (`a permanent refusal, not retried`, store/outbox.py): the row said it twice.
  function deadReason(x) {
    const said = String(x.last_error || "").includes("not retried");
    const why = x.dead_reason === "max_attempts" ? `out of attempts (${(x.attempts || 0) - (x.throttled || 0)} failed)`
      : x.dead_reason === "refused" && !said ? "refused, never retried" : null;
    return why ? el("span", { class: "dead-reason" }, ` (${why})`) : null;
  }
  function deliveryError(x) {
    return [x.last_error || "—", deadReason(x), retriedBy(x), x.status === "discarded"
      ? el("p", { class: "muted discarded" }, `discarded by ${x.discarded_by || "?"} `, when(x.discarded_at),
        x.discarded_from === "pending" ? " (it was pending, not dead-lettered)" : "", `: ${x.discard_reason || "—"}`) : null];
  }
  function deliveryWhat(x) {
    return x.kind === "action" ? ["action ", el("code", {}, x.action_id || "?")] : ["event ", el("code", {}, x.event_id || "?")];
  }
  function deliveryAttempts(x) {
    return `${x.attempts}${x.throttled ? ` (${x.throttled} throttled)` : ""}`;
  }
  // A pending task event held in order behind its task's dead letter (`waits_behind`): due, but
  // not sent until that dead letter is retried or discarded, which read as a stuck dispatcher.
  // The dead letter is named, with its Retry (once per table: `offered` holds those shown) and
  // its task's page, where it is retried or discarded.
  function waitsBehind(x, offered, say, after) {
    const dead = x.waits_behind;
    const offer = !offered.has(dead) && can("operator");
    offered.add(dead);
    return el("span", { class: "waits-behind" }, `waits behind dead letter ${dead}`,
      " ", offer ? retryButton({ outbox_id: dead }, say, after) : null, " ",
      el("a", { href: `#/task/${encodeURIComponent(x.task_id)}` }, offer ? "or discard it on its task's page"
        : can("operator") ? "retry or discard it on its task's page" : "see it on its task's page"));
  }

  // A pending webhook held in order behind an earlier event of its task that keeps failing (not
  // dead yet): it read due and never attempted, as if nothing sent it. The API names that one
  // (`waits_behind_retried`), as `outbox list` and `tasks show` do, so all three say the same.
  function waitsBehindRetried(x) {
    return el("span", { class: "waits-behind" }, `waits behind delivery ${x.waits_behind_retried}, being retried`);
  }

  // Every delivery of a status (dead by default) and kind, across tasks, oldest first.
  const DELIVERY_STATUSES = ["dead", "pending", "delivered", "discarded"];
  function deliveryList(params) {
    const status = DELIVERY_STATUSES.includes(params.get("status")) ? params.get("status") : "dead";
    const kind = ["action", "webhook"].includes(params.get("kind")) ? params.get("kind") : "";
    // One task's deliveries (`task=ID`, as `outbox list --task`): a task's page links here.
    const task = (params.get("task") || "").trim();
    const taskNote = task ? el("p", { id: "delivery-task" }, "Of task ",
      el("a", { href: `#/task/${encodeURIComponent(task)}` }, el("code", {}, task)), " only. ",
      el("a", { href: `#/deliveries?${new URLSearchParams(kind ? { status, kind } : { status })}` }, "All tasks")) : null;
    const statusPick = el("select", { id: "d-status", name: "status" },
      DELIVERY_STATUSES.map((x) => el("option", { value: x, selected: x === status }, x)));
    const kindPick = el("select", { id: "d-kind", name: "kind" },
      [["", "any"], ["action", "approved actions"], ["webhook", "task events"]].map(([v, t]) => el("option", { value: v, selected: v === kind }, t)));
    const rows = el("div", { id: "delivery-rows" }, el("p", { class: "muted" }, "Loading…"));
    const say = el("p", { role: "status", id: "delivery-result" });
    // Drawn once, apart from the rows a poll redraws: a confirmation being answered stays.
    const bulk = status === "pending" && can("operator") ? retryFailingBox(kind, task, say, load) : null;
    if (bulk) bulk.hidden = true; // until there are rows
    // As the task list does: `status=failed` in a hand-edited address listed the dead ones, and
    // `kind=email` every kind, unsaid.
    const ignored = [];
    if (params.get("status") && params.get("status") !== status) ignored.push(`status=${params.get("status")} (one of ${DELIVERY_STATUSES.join(", ")})`);
    if (params.get("kind") && params.get("kind") !== kind) ignored.push(`kind=${params.get("kind")} (action or webhook)`);
    const notice = ignored.length ? el("p", { class: "notice", id: "delivery-ignored", role: "status" },
      `Not understood, so not applied: ${ignored.join("; ")}.`) : null;
    fill(main, el("h1", {}, "Deliveries to the business backend"),
      el("form", { class: "inline", id: "delivery-filters", onsubmit: (event) => {
        event.preventDefault();
        const query = new URLSearchParams({ status: statusPick.value });
        if (kindPick.value) query.set("kind", kindPick.value);
        if (task) query.set("task", task);
        location.hash = `#/deliveries?${query}`;
      } }, el("div", {}, el("label", { for: "d-status" }, "Status"), statusPick),
      el("div", {}, el("label", { for: "d-kind" }, "Kind"), kindPick),
      el("button", { type: "submit", class: "secondary" }, "Show")),
      notice, taskNote, bulk, say, rows);
    const at = viewKey();
    const held = new Map(); // the list's tag, when the server gives one
    let alive = true, shown = null, asked = 0, drawn = 0, last = null;
    async function load() {
      const query = new URLSearchParams({ status, limit: "100" });
      if (kind) query.set("kind", kind);
      if (task) query.set("task_id", task);
      const read = ++asked;
      const result = await watched(held, `outbox?${query}`);
      // A poll answered after the read a Retry or Discard made would show the row as it was.
      if (!alive || !shownAt(at) || read < drawn) return;
      drawn = read;
      if (result.unchanged) { if (last) draw(last); return; } // as shown, unless by the clock
      if (!result.ok) {
        if (!result.down) fill(rows, el("p", { class: "error" }, missingRoute(result) ? "Not available on this server." : errorText(result)));
        return;
      }
      draw(result.data);
    }
    function draw(data) {
      last = data;
      const items = itemsOf(data);
      const key = JSON.stringify([items, data.next_cursor || null, deliveryClock(items)]);
      if (key === shown) return; // a button is not redrawn under the pointer
      shown = key;
      const typed = typedIn(rows); // a discard reason being typed survives a redraw
      const offered = new Set();
      fill(rows, items.length ? [table(["Delivery", "Task", "What", "Status", "Attempts", "Next attempt", "Last error", ""], items.map((x) => [
        el("code", {}, String(x.outbox_id)),
        el("a", { href: `#/task/${encodeURIComponent(x.task_id)}` }, el("code", {}, x.task_id)),
        deliveryWhat(x), deliveryStatus(x), deliveryAttempts(x),
        x.waits_behind ? waitsBehind(x, offered, say, load)
          : x.waits_behind_retried ? waitsBehindRetried(x)
          : isBeingSent(x) ? beingSentNow(x)
          : x.status === "pending" ? when(x.next_attempt_at) : x.status === "delivered" ? when(x.delivered_at) : "—",
        deliveryError(x),
        deadControls(x, say, load)])),
        status === "dead" && can("operator") ? retryEveryButton(kind, task, say, load) : null,
        data.next_cursor ? notice(`The first 100 are shown; orchestrator outbox list${task ? ` --task ${task}` : ""} prints them all.`) : null,
        items.some((x) => x.status === "dead" || isFailing(x)) && !can("operator") ? cannot("operator", "retrying or discarding a delivery") : null]
        : el("p", { class: "muted" }, `No ${status} delivery.`));
      restoreTyped(rows, typed);
      if (bulk) bulk.hidden = !items.length;
    }
    load();
    const timer = setInterval(load, POLL_MS * 2);
    return { dispose() { alive = false; clearInterval(timer); } };
  }

  // ---- actions (approvals) ---------------------------------------------------------------
  // The pending actions in `list`, one card each, as the API lists them. A card still pending
  // stays the same element: a poll that found a new action (or one decided elsewhere) used to
  // draw every card again, wiping the name and note an approver was typing and the focus.
  // Cards already shown keep their order, so none is moved (a moved element loses focus).
  // Oldest first (the API lists newest first): one proposed meanwhile is added at the end, not
  // on top, where it pushed the card being decided down under the pointer.
  function showActions(list, newestFirst, after, say) {
    const actions = newestFirst.slice().reverse();
    const cards = new Map([...list.querySelectorAll(":scope > [data-action]")]
      .map((card) => [card.getAttribute("data-action"), card]));
    const next = actions.map((a) => cards.get(a.action_id) || actionCard(a, after, say));
    const keep = new Set(next);
    for (const child of [...list.childNodes]) if (!keep.has(child)) child.remove();
    let at = list.firstChild;
    for (const card of next) {
      if (card === at) at = at.nextSibling;
      else list.insertBefore(card, at);
    }
    if (!actions.length) list.appendChild(el("p", { class: "muted" }, "Nothing waits for approval."));
  }
  function actionCard(action, after, say) {
    const message = el("p", { class: "result", role: "status" });
    const note = el("input", { name: "note", id: `note-${action.action_id}`, maxlength: 2000 });
    const byId = `by-${action.action_id}`;
    async function decide(verb, event) {
      const form = event.currentTarget.closest("form");
      const by = document.getElementById(byId).value.trim();
      if (!by) { fill(message, el("span", { class: "error" }, "Your name is needed to decide.")); return; }
      remember(by);
      const body = { by };
      if (note.value.trim()) body.note = note.value.trim();
      if (action.digest) body.digest = action.digest;
      const result = await sendOnce(form, "POST", `actions/${encodeURIComponent(action.action_id)}/${verb}`, body);
      if (!result) return;
      if (result.ok) {
        fill(message, `${verb === "approve" ? "Approved" : "Rejected"}.`);
        // The card leaves the list once decided: said where it stays.
        if (say) fill(say, `${verb === "approve" ? "Approved" : "Rejected"}: ${action.kind || "action"} for node ${action.node_id} of task ${action.task_id}.`);
        if (after) after();
      } else {
        fill(message, el("span", { class: "error" }, errorText(result)));
      }
    }
    return el("article", { class: "card action", "data-action": action.action_id },
      el("h3", {}, `${action.kind || "action"} for node `, el("code", {}, action.node_id)),
      facts([["Status", badge(action.status)],
        ["Task", el("a", { href: `#/task/${encodeURIComponent(action.task_id)}` }, action.task_id)],
        ["Generation", String(action.generation)], ["Proposed", when(action.created_at)],
        ["Digest", action.digest ? el("code", { class: "digest" }, action.digest) : el("span", { class: "muted" }, "not provided by this server")]]),
      el("h3", {}, "Payload"), typeof action.payload === "string" ? unreadable(action.payload) : json(action.payload),
      action.status === "pending_approval" && !can("approver") ? cannot("approver", "deciding on an action") :
      action.status === "pending_approval" ? el("form", { class: "inline", onsubmit: (e) => e.preventDefault() },
        el("div", {}, byField(byId)),
        el("div", {}, el("label", { for: note.id }, "Note"), note),
        el("button", { type: "button", class: "approve", onclick: (event) => decide("approve", event) }, "Approve"),
        el("button", { type: "button", class: "danger reject", onclick: (event) => decide("reject", event) }, "Reject"))
        : facts([["Decided by", action.decided_by], ["Note", action.note]]),
      message);
  }

  // Every pending action (of one task, with `filter` "&task_id=..."), page after page: the API
  // lists newest first, so one page of 100 hid the oldest, the longest waiting, whenever more
  // than 100 were pending. The failed answer if a page fails. With `held` (a Map the view owns,
  // as for `watched`) each page's tag is sent, and `unchanged` says that every page was a 304:
  // an open task's pending actions are polled every 3 s, nearly always unchanged.
  async function pendingActions(filter, held) {
    const items = [];
    let cursor = null, unchanged = Boolean(held);
    do {
      const query = `actions?status=pending_approval&limit=200${filter}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const result = held ? await watched(held, query) : await api("GET", query);
      if (!result.ok) return result;
      unchanged = unchanged && Boolean(result.unchanged);
      items.push(...itemsOf(result.data));
      cursor = result.data.next_cursor || null;
    } while (cursor);
    return { ok: true, items, unchanged };
  }

  // The oldest `wanted` pending actions, oldest first, a page of the API at a time, each with
  // the tag held of it (`held`, as for `watched`): `unchanged` when every page was a 304.
  async function oldestPending(wanted, held) {
    const items = [];
    let cursor = null, unchanged = true;
    do {
      const limit = Math.min(200, wanted - items.length);
      const query = `actions?status=pending_approval&order=oldest&limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const result = await watched(held, query);
      if (!result.ok) return result;
      unchanged = unchanged && Boolean(result.unchanged);
      items.push(...itemsOf(result.data));
      cursor = result.data.next_cursor || null;
    } while (cursor && items.length < wanted);
    return { ok: true, items, more: Boolean(cursor), unchanged };
  }

  // How many wait (the API's count) and the oldest of them, a page more at each "Show more".
  // A refresh reads the count and the cards shown: with thousands pending, every refresh
  // fetched all of them, page after page, and drew a card for each.
  const APPROVALS_PAGE = 50;
  function approvals() {
    const list = el("div", { class: "actions-list", id: "approvals" }, el("p", { class: "muted" }, "Loading…"));
    const say = el("p", { role: "status", id: "approvals-result" });
    const count = el("p", { id: "approvals-count" });
    let shown = APPROVALS_PAGE;
    const more = el("button", { type: "button", id: "approvals-more", hidden: true,
      onclick: () => { shown += APPROVALS_PAGE; load(); } }, `Show ${APPROVALS_PAGE} more`);
    const readBox = el("div", { id: "approvals-read" }); // says when they could not be read
    fill(main, el("h1", {}, "Pending approvals"), count, say, readBox, list, more);
    const at = viewKey();
    const held = new Map(); // the count and the pages shown, sent again only when changed
    let alive = true, asked = 0, drawn = 0, listed = false;
    async function load() {
      const read = ++asked;
      const [counted, result] = await Promise.all([watched(held, "actions/pending-count"), oldestPending(shown, held)]);
      if (!alive || !shownAt(at)) return;
      // A poll answered after a newer read (Show more, a decision) would take its cards away.
      if (read < drawn) return;
      drawn = read;
      // A read that failed was said as text alone, in place of the cards, with no way to read
      // them again but a reload: said as the task page says it (readFailed), with Retry, the
      // cards shown (if any) kept as last read.
      if (!result.ok) {
        const failed = readFailed("approvals-error", "The pending approvals", result, load);
        const shownError = readBox.firstChild;
        if (!shownError || shownError.textContent !== failed.textContent || shownError.querySelector("button:disabled")) fill(readBox, failed);
        if (!listed) fill(list); // not "Loading…" under the error
        return;
      }
      fill(readBox);
      listed = true;
      if (counted.unchanged && result.unchanged) return; // as shown
      showActions(list, result.items.slice().reverse(), load, say);
      more.hidden = !result.more;
      const pending = counted.ok ? counted.data.pending : null;
      fill(count, pending === null ? "" : result.more
        ? `${pending} pending; the ${result.items.length} oldest are shown, the longest waiting first.`
        : `${pending} pending.`);
    }
    load();
    const timer = setInterval(load, POLL_MS * 2);
    return { dispose() { alive = false; clearInterval(timer); } };
  }

  // ---- task detail -----------------------------------------------------------------------
  function taskDetail(taskId, params) {
    const path = `tasks/${encodeURIComponent(taskId)}`;
    const s = { alive: true, key: viewKey(), asked: 0, drawn: 0, pendingAsked: 0, pendingDrawn: 0, transcriptAsked: 0, transcriptDrawn: 0, task: null, plan: null, selected: null, stream: null, timer: null, held: new Map(), heldActions: new Map(),
      graph: null, streamKind: null, retry: null, nodeDone: null, receiptKey: null, recordsKey: null, deliveryKey: null,
      recoveryKey: null };
    // A reload restores the revision and the node shown (#/task/ID?session=S&revision=N&node=X);
    // a revision of another session than the live plan's (a newer generation) is not restored.
    s.selected = params.get("node") || null;
    s.restore = params.get("session") && Number(params.get("revision")) >= 1
      ? { session: params.get("session"), revision: Number(params.get("revision")) } : null;
    // This page is open and the address still names it (see shownAt).
    const here = () => s.alive && shownAt(s.key);
    function keepInAddress() {
      if (!here()) return; // another view's address is not overwritten
      const query = new URLSearchParams();
      if (s.viewing) {
        query.set("session", s.viewing.session_id);
        query.set("revision", String(s.viewing.revision));
      } else if (s.restore) {
        query.set("session", s.restore.session);
        query.set("revision", String(s.restore.revision));
      }
      if (s.selected) query.set("node", s.selected);
      const hash = `#/task/${encodeURIComponent(taskId)}${[...query].length ? `?${query}` : ""}`;
      if (location.hash !== hash) history.replaceState(null, "", hash); // no hashchange
    }
    const part = (id) => el("div", { id });
    const head = part("task-head");
    const live = el("span", { class: "live off", id: "live" }, "connecting");
    const lease = part("lease"), generations = part("generations"), planBox = part("plan");
    const nodeDetail = el("div", { id: "node-detail", class: "node-detail", tabindex: "-1", hidden: true });
    const pending = el("div", { id: "pending-actions", class: "actions-list" });
    const pendingResult = el("p", { role: "status", id: "pending-result" });
    const pendingRead = el("div", { id: "pending-read" }); // says when they could not be read
    const report = part("report"), receipts = part("receipts");
    const inFlight = part("running-receipts");
    const resolved = part("resolutions");
    const evidence = part("evidence"), transcript = part("transcript");
    const deliveries = part("deliveries"), recovery = part("recovery");
    const opResult = el("p", { role: "status", id: "op-result" });

    function reasonForm(id, label, verb, cls) {
      const input = el("input", { id, name: "reason", required: true, maxlength: 500, placeholder: "reason" });
      // Hidden until the task's state is known (showTask): a finished task's page, slow to
      // load, offered Cancel until its first answer, and the API then said 409.
      return el("form", { class: "inline", id: `${verb}-form`, hidden: true, onsubmit: async (event) => {
        event.preventDefault();
        const reason = input.value.trim();
        if (!reason) { fill(opResult, el("span", { class: "error" }, "A reason is needed.")); return; }
        const result = await sendOnce(event.currentTarget, "POST", `${path}/${verb}`, { reason });
        if (!result) return;
        // A requeue the broker did not take (`dispatched: false`, Redis down) is committed all
        // the same, and no worker was woken: "done." alone read as on its way.
        const unsent = result.ok && result.data && result.data.dispatched === false;
        if (result.ok) {
          input.value = "";
          fill(opResult, unsent ? `${label}: done; its wake-up was not sent (Redis refused it): the sweeper sends it once Redis takes messages again.`
            : `${label}: done.`);
          refresh();
        } else fill(opResult, el("span", { class: "error" }, errorText(result)));
      } }, el("div", {}, el("label", { for: id }, `${label} reason`), input),
      el("button", { type: "submit", class: cls }, label));
    }

    // An operator who checked the target system settles an unknown or pending write.
    function resolveForm(receipt) {
      const id = receipt.invocation_id;
      const status = el("select", { id: `resolve-as-${id}`, name: "status" },
        el("option", { value: "succeeded" }, "succeeded"), el("option", { value: "failed" }, "failed"));
      const reason = el("input", { id: `resolve-reason-${id}`, name: "reason", required: true, maxlength: 500, placeholder: "how you know" });
      const message = el("p", { role: "status", class: "resolve-result" });
      const byId = `resolve-by-${id}`;
      return el("form", { class: "inline resolve", "data-invocation": id, onsubmit: async (event) => {
        event.preventDefault();
        const form = event.currentTarget;
        const by = document.getElementById(byId).value.trim();
        if (!by) { fill(message, el("span", { class: "error" }, "Your name is needed.")); return; }
        if (!reason.value.trim()) { fill(message, el("span", { class: "error" }, "A reason is needed.")); return; }
        remember(by);
        const result = await sendOnce(form, "POST", `invocations/${encodeURIComponent(id)}/resolve`,
          { status: status.value, reason: reason.value.trim(), by });
        if (!result) return;
        if (result.ok) {
          fill(opResult, `Invocation ${id} resolved as ${result.data.status}; the task is ${result.data.task_status}.`);
          refresh();
        } else fill(message, el("span", { class: "error" }, errorText(result)));
      } },
      el("h3", {}, "Resolve ", el("code", {}, id)),
      el("div", {}, byField(byId)),
      el("div", {}, el("label", { for: status.id }, "It was"), status),
      el("div", {}, el("label", { for: reason.id }, "Reason"), reason),
      el("button", { type: "submit", class: "secondary" }, "Resolve"),
      message);
    }

    fill(main,
      el("p", {}, el("a", { href: "#/" }, "← Tasks")),
      head,
      el("section", { class: "card", "aria-labelledby": "h-ops" }, el("h2", { id: "h-ops" }, "Operator actions"),
        can("operator") ? el("div", { class: "row" }, reasonForm("requeue-reason", "Requeue", "requeue", "secondary"),
          reasonForm("cancel-reason", "Cancel", "cancel", "danger")) : cannot("operator", "requeueing or cancelling"),
        opResult),
      el("section", { class: "card", "aria-labelledby": "h-plan" },
        el("div", { class: "row" }, el("h2", { id: "h-plan" }, "Plan"), live), planBox, nodeDetail),
      el("section", { class: "card", "aria-labelledby": "h-pending" }, el("h2", { id: "h-pending" }, "Pending approvals"), pendingResult, pendingRead, pending),
      el("div", { class: "grid2" },
        el("section", { class: "card", "aria-labelledby": "h-lease" }, el("h2", { id: "h-lease" }, "Lease"), lease),
        el("section", { class: "card", "aria-labelledby": "h-report" }, el("h2", { id: "h-report" }, "Report"), report)),
      el("section", { class: "card", "aria-labelledby": "h-gen" }, el("h2", { id: "h-gen" }, "Generations"), generations),
      el("section", { class: "card", "aria-labelledby": "h-receipts" }, el("h2", { id: "h-receipts" }, "Receipts"), receipts, inFlight, resolved),
      el("section", { class: "card", "aria-labelledby": "h-recovery" }, el("h2", { id: "h-recovery" }, "Recovery"), recovery),
      el("section", { class: "card", "aria-labelledby": "h-deliveries" }, el("h2", { id: "h-deliveries" }, "Deliveries to the business backend"), deliveries),
      el("section", { class: "card", "aria-labelledby": "h-evidence" }, el("h2", { id: "h-evidence" }, "Evidence"), evidence),
      el("section", { class: "card", "aria-labelledby": "h-transcript" }, el("h2", { id: "h-transcript" }, "Transcript"), transcript));

    function showTask(task) {
      const statusChanged = !s.task || s.task.status !== task.status;
      s.task = task;
      // The evidence and the transcript follow the task: read again when it wrote or changed
      // state (a finished task's report must not sit beside "No evidence recorded." until the
      // next slow poll); otherwise every POLL_MS * 5.
      const recordsKey = JSON.stringify([task.status, task.generation, task.last_write || null]);
      if (s.recordsKey !== null && s.recordsKey !== recordsKey) loadRecords();
      s.recordsKey = recordsKey;
      // A requeue brings a finished task back: follow it live again.
      if (!FINAL_STATUSES.has(task.status)) s.ended = false;
      if (finished() && s.stream === null) endStream();
      // A finished task cannot be cancelled (the API says 409): the form is not offered.
      const requeueForm = document.getElementById("requeue-form");
      if (requeueForm) requeueForm.hidden = false;
      const cancelForm = document.getElementById("cancel-form");
      if (cancelForm) cancelForm.hidden = FINAL_STATUSES.has(task.status);
      fill(head, el("h1", { id: "task-title" }, task.title || task.task_id),
        el("section", { class: "card" }, facts([
          ["Status", [badge(task.status), task.failure_code ? ` ${task.failure_code}` : "", handedBack(task, "handed-back"),
            wakeUpUnsent(task, "wake-up-unsent")]],
          // Why no round runs although the task reads `running`, and until when.
          ...(task.handed_back ? [["Handed back", el("span", { id: "handed-back-reason" }, task.handed_back.reason || "—")]] : []),
          ["Task id", el("code", {}, task.task_id)], ["Type", task.task_type],
          ["Generation", String(task.generation)], ["Session", task.session_id ? el("code", {}, task.session_id) : "—"],
          ["Rounds", String(task.rounds)], ["Lost generations", lostGenerations(task)],
          ["Created", when(task.created_at)], ["Updated", when(task.updated_at)],
          ["Last error", task.last_error || "—"],
          // What a waiting task waits on now: a decision or a person's step says it anew.
          ...(task.status === "waiting" && task.waiting_on ? [["Waiting on", el("span", { id: "waiting-on" }, task.waiting_on)]] : []),
          ["Last write", lastWrite(task.last_write)]])));
      // A lease Redis lost (restarted empty, flushed, away) is shown from the store's mirror
      // (`source: "store"`): said so, since no live lease back end vouches for it.
      const mirrored = task.lease && task.lease.source === "store";
      fill(lease, task.lease ? [mirrored ? el("p", { class: "notice", id: "lease-from-store" },
        "The store's copy, not confirmed by Redis: Redis holds no lease for this round (restarted empty, flushed or away). " +
        "Its worker takes the lease back at its next renewal, or the sweeper requeues the task once it expires.") : null,
        facts([["Holder", el("code", {}, task.lease.holder)],
          ["Expires", when(task.lease.expires_at)], ["Renewed", when(task.lease.last_renewed_at)]])]
        : el("p", { class: "muted" }, task.handed_back ? "No lease: the round was handed back and waits to be requeued."
          : task.status === "running" ? "No live lease." : `No lease: the task is ${task.status}.`));
      const executions = task.executions || [];
      fill(generations, executions.length ? table(["Generation", "Outcome", "Worker", "Started", "Ended", "Reason"],
        executions.slice().reverse().map((x) => [String(x.generation),
          x.outcome ? [badge(x.outcome), x.failure_code ? ` ${x.failure_code}` : ""]
            : el("span", { class: "muted" }, task.handed_back && x.generation === task.generation ? "handed back" : "in progress"),
          x.worker || "—", when(x.started_at), when(x.ended_at), x.reason || "—"]))
        : el("p", { class: "muted" }, "No generation yet."));
      const r = task.report;
      fill(report, r ? [facts([["Outcome", badge(r.outcome)], ["Generation", String(r.generation)], ["Saved", when(r.created_at)]]),
        el("p", { id: "report-summary" }, r.summary || ""),
        (r.findings || []).length ? el("ul", { class: "findings" }, r.findings.map(finding)) : null,
        (r.evidence_refs || []).length ? [el("h3", {}, "Evidence references"),
          el("ul", { class: "refs" }, r.evidence_refs.map((ref) => el("li", {}, typeof ref === "string" ? citation(ref) : el("code", {}, JSON.stringify(ref)))))] : null]
        : el("p", { class: "muted" }, "No report for this generation yet."));
      loadCited(); // the records the report cites, when on no page shown
      const unknown = task.unknown_receipts || [];
      const receiptKey = unknown.map((x) => `${x.invocation_id}:${x.status}`).join();
      if (receiptKey !== s.receiptKey) { // keep a half-typed resolution across refreshes
        s.receiptKey = receiptKey;
        fill(receipts, unknown.length ? [table(["Invocation", "Tool", "Status", "Summary", "Updated"],
          unknown.map((x) => [el("code", {}, x.invocation_id), x.tool_name, badge(x.status, true), x.summary || "—", when(x.updated_at)])),
          can("operator") ? unknown.map(resolveForm) : cannot("operator", "resolving a write")]
          : el("p", { class: "muted" }, "No receipt is unknown or pending."));
      }
      // Writes in flight, apart (redrawing them must not lose a half-typed resolution): the task
      // is not completed while one runs (invariant 23).
      const running = task.running_receipts || [];
      fill(inFlight, running.length ? [el("h3", { id: "h-running" }, `Still running (${running.length})`),
        table(["Invocation", "Tool", "Status", "Since"], running.map((x) => [el("code", {}, x.invocation_id),
          x.tool_name, badge(x.status), when(x.updated_at)]))] : null);
      // Who settled which write, newest first (the server keeps the newest 50 in the view).
      const settled = task.resolutions || [];
      fill(resolved, settled.length ? [el("h3", { id: "h-resolutions" }, "Resolved by operators"),
        table(["Invocation", "Tool", "Was → now", "By", "Reason", "When"], settled.slice().reverse().map((x) => typeof x === "string"
          ? [unreadable(x), "—", "—", "—", "—", "—"] : [
          el("code", {}, x.invocation_id), x.tool_name,
          [badge(x.previous_status, true), " → ", badge(x.resolved_status)], x.by, x.note, when(x.at)]))]
        : null);
      const recoveryKey = JSON.stringify(task.recovery === undefined ? "missing" : task.recovery);
      if (recoveryKey !== s.recoveryKey) {
        s.recoveryKey = recoveryKey;
        fill(recovery, renderRecovery(task.recovery));
      }
      drawDeliveries(task);
      if (task.plan && (!s.plan || task.plan.revision > s.plan.revision || task.plan.session_id !== s.plan.session_id)) showPlan(task.plan);
      if (!task.plan && !s.plan) loadEarlierPlan();
      // A new generation without a plan yet: the one shown is now an earlier generation's, and
      // the notice names the generation there is now.
      const notice = document.getElementById("plan-earlier");
      if (s.plan && (notice ? notice.textContent : null) !== earlierNotice()) drawPlan();
      else if (s.plan && statusChanged) drawPlan(); // the picker's "live" follows the status
      if (s.stream && s.streamKind === "session" && task.session_id && s.streamSession !== task.session_id) {
        // A new generation's session: follow it. The plan shown stays until that session
        // publishes (showPlan then drops a revision pinned in the old one), as with the task
        // stream: emptying it here left the pinned revision without its plan, and Back to the
        // latest failed on it.
        s.stream.close();
        s.stream = null;
      }
      // A finished task has nothing more to stream: its stream is not opened again (each one
      // sent its snapshot, ended and asked for a refresh, which opened the next: a loop).
      if (statusChanged && s.selected && !nodeDetail.hidden) showNode(s.selected, false);
      if (!s.stream && !finished()) openStream();
    }

    // The live plan is s.plan; a person may look at an older revision of its session
    // (s.viewing) while the live one goes on updating underneath.
    function showPlan(plan) {
      if (!plan || !Array.isArray(plan.nodes)) return;
      s.plan = plan;
      if (s.viewing && s.viewing.session_id !== plan.session_id) s.viewing = null; // a new generation
      // The revision a reload asked for, kept in the address until it is read.
      const wanted = s.restore;
      s.restore = wanted && wanted.session === plan.session_id && wanted.revision < plan.revision ? wanted : null;
      drawPlan();
      if (s.restore) viewRevision(s.restore.revision, false);
    }
    function drawnPlan() {
      return s.viewing || s.plan;
    }
    function drawPlan() {
      const plan = drawnPlan();
      loadCited(); // the records its nodes cite, when on no page shown
      const focused = document.activeElement && document.activeElement.getAttribute("data-node");
      const control = document.activeElement && ["plan-revision", "plan-latest"].includes(document.activeElement.id)
        ? document.activeElement.id : null;
      // A redraw (a new revision, the stream's snapshot) keeps where the graph was scrolled:
      // one scrolled sideways to a branch must not jump back to the first one.
      const scrolled = s.graph ? { left: s.graph.scrollLeft, top: s.graph.scrollTop } : null;
      if (s.graph && s.graph.dispose) s.graph.dispose();
      s.graph = planGraph(plan, s.selected, select);
      const earlier = earlierNotice();
      fill(planBox, el("h3", { id: "plan-title" }, plan.title || ""),
        earlier ? el("p", { class: "notice", id: "plan-earlier" }, earlier) : null,
        revisionPicker(),
        el("p", { class: "muted" }, `revision ${plan.revision}`, plan.reason ? " · " : "", plan.reason ? el("span", { id: "plan-reason" }, plan.reason) : null),
        countsOf(plan), s.graph, olderParts(plan));
      if (scrolled) { s.graph.scrollLeft = scrolled.left; s.graph.scrollTop = scrolled.top; }
      // First drawn wider than the card: show its middle, where the trunk runs (each layer is
      // centred), not its left edge with the trunk cut off.
      else s.graph.scrollLeft = (s.graph.scrollWidth - s.graph.clientWidth) / 2;
      if (focused) {
        const again = planBox.querySelector(`button[data-node="${CSS.escape(focused)}"]`);
        if (again) again.focus();
      }
      if (control) (document.getElementById(control) || document.getElementById("plan-revision")).focus();
      if (s.selected) showNode(s.selected, false);
      keepInAddress();
    }
    // What the shown plan is when an earlier generation published it, or null: said again when
    // the task moves on (another generation, a final status).
    function earlierNotice() {
      const plan = s.plan;
      if (!s.task || !plan || !plan.session_id || plan.session_id === s.task.session_id) return null;
      const from = (s.task.executions || []).find((x) => x.session_id === plan.session_id);
      return `From generation ${from ? from.generation : "an earlier generation"}: generation ${s.task.generation} has published no plan of its own${FINAL_STATUSES.has(s.task.status) ? "" : " yet"}.`;
    }
    // Every revision of the live plan's session (they are numbered 1, 2, ... without gaps).
    function revisionPicker() {
      const latest = s.plan.revision;
      // "live" only for the current generation's plan of a task still going: it can change.
      const live = !earlierNotice() && !(s.task && FINAL_STATUSES.has(s.task.status));
      const picker = el("select", { id: "plan-revision", onchange: () => viewRevision(Number(picker.value)) });
      for (let n = latest; n >= 1; n -= 1) {
        picker.appendChild(el("option", { value: String(n), selected: n === drawnPlan().revision }, n === latest ? `${n} (latest${live ? ", live" : ""})` : String(n)));
      }
      return el("div", { class: "row revisions" }, el("label", { for: "plan-revision" }, "Revision"), picker,
        s.viewing ? [el("span", { class: "notice", id: "plan-old" }, `An earlier revision: the plan is at ${latest}.`),
          el("button", { type: "button", class: "secondary", id: "plan-latest", onclick: () => viewRevision(latest) }, "Back to the latest")] : null,
        el("span", { role: "status", class: "error", id: "plan-revision-error" }));
    }
    async function viewRevision(revision, focus = true) {
      if (!s.plan || revision === s.plan.revision) {
        s.viewing = null;
        drawPlan();
        return;
      }
      const session = s.plan.session_id;
      const result = await api("GET", `sessions/${encodeURIComponent(session)}/execution-plans/${revision}`);
      if (!here()) return;
      s.restore = null;
      if (!s.plan || s.plan.session_id !== session) { drawPlan(); return; } // a new generation meanwhile
      if (result.ok && result.data && Array.isArray(result.data.nodes)) {
        s.viewing = result.data;
        drawPlan();
        const picker = document.getElementById("plan-revision");
        if (picker && focus) picker.focus();
      } else {
        const box = document.getElementById("plan-revision-error");
        if (box) fill(box, errorText(result));
      }
    }

    // The explain view carries the current generation's plan; until that generation publishes,
    // the task's latest plan from an earlier one is shown, and said to be so.
    // `again`: a newer revision of the plan shown (a person closed a step in it), never another
    // session's (a newer generation's plan comes with the task).
    async function loadEarlierPlan(again = false) {
      const result = await api("GET", `${path}/plan`);
      if (!here()) return;
      const plan = result.ok && result.data ? result.data.plan : null;
      if (again) {
        if (plan && s.plan && plan.session_id === s.plan.session_id && plan.revision > s.plan.revision) showPlan(plan);
        return;
      }
      if (s.plan) return;
      if (plan) showPlan(plan);
      else fill(planBox, el("p", { class: "muted" }, "No plan published yet."));
    }

    // Escape in a node's details goes back to its node in the graph (the details stay open,
    // with what was typed): a keyboard user had to Tab back through the whole page.
    nodeDetail.addEventListener("keydown", (event) => {
      if (event.key !== "Escape" || !s.selected) return;
      const node = planBox.querySelector(`button.node[data-node="${CSS.escape(s.selected)}"]`);
      if (node) { event.preventDefault(); node.focus(); }
    });

    function select(id) {
      s.selected = id;
      keepInAddress();
      for (const b of planBox.querySelectorAll("button.node")) b.setAttribute("aria-pressed", String(b.getAttribute("data-node") === id));
      showNode(id, true);
    }

    // A failed node holds the completion until a retry of it is completed: a new node of the
    // same actor drawn from it since it failed (the plan's `retries`, domain/retries.py; a
    // retry that failed has its own retry).
    const CLOSED_AS = { complete: "completed", fail: "failed", skip: "skipped" };
    function retriesOf(node) {
      const retries = retriesIn(drawnPlan(), node);
      if (!retries.length) return el("span", { class: "error" }, "no retry yet: the task cannot complete until one is completed");
      return retries.map((n, i) => [i ? ", " : "", el("code", {}, n.id), " ", badge(n.status)]);
    }
    function citedBy(node) {
      const ids = Array.isArray(node.evidence_ids) ? node.evidence_ids : [];
      return ids.length ? el("span", { class: "cites" }, ids.map((x, i) => [i ? ", " : "", citation(x)])) : "—";
    }
    function showNode(id, focus) {
      const node = s.plan && nodesOf(drawnPlan()).find((n) => n.id === id);
      if (!node) { nodeDetail.hidden = true; return; }
      const result = el("p", { role: "status", class: "node-result" });
      const open = node.actor === "human" && !NODE_DONE.includes(node.status);
      // A step is closed in the task's latest plan of a task still going: not from an earlier
      // revision or a finished task (the API refuses those: node_closed, task_finished). An
      // earlier generation's plan shown while the current one has published none is the
      // task's latest: the server writes the step there, and the next plan keeps it.
      const closedHere = !open ? null
        : s.viewing ? "An earlier revision: go back to the latest to close this step."
        : s.task && FINAL_STATUSES.has(s.task.status) ? `The task is ${s.task.status}: its steps can no longer be closed.`
        : null;
      const human = open && !closedHere && can("operator");
      const stepKey = `step:${taskId}:${id}`; // the step's write, whichever form sent it
      async function finish(verb, body) {
        const by = document.getElementById("node-by").value.trim();
        if (!by) { fill(result, el("span", { class: "error" }, "Your name is needed.")); return; }
        remember(by);
        const answer = await sendOnce(document.getElementById("human-node"), "POST", `${path}/nodes/${encodeURIComponent(id)}/${verb}`, { by, ...body }, stepKey);
        if (!answer) return;
        if (answer.ok) {
          s.nodeDone = { id, text: `Node ${CLOSED_AS[verb]}.` }; // kept when the new revision redraws the node
          // Said where the node is shown now: the stream may have drawn the new revision (and a
          // new result line) before this answer came, and nothing draws it again after.
          const shown = nodeDetail.getAttribute("data-node") === id ? nodeDetail.querySelector(".node-result") : null;
          fill(shown || result, s.nodeDone.text);
          // An earlier generation's plan is not in the task's view: read the task's plan again,
          // so the step shows closed without waiting for the stream.
          if (earlierNotice()) loadEarlierPlan(true);
          refresh();
        }
        else fill(result, el("span", { class: "error" }, missingRoute(answer) ? "Completing human nodes is not available on this server." : errorText(answer)));
      }
      // As long as the API takes (api/human_steps.py): a longer text typed in full was refused
      // only after the button was pressed.
      const evidenceInput = el("textarea", { id: "node-evidence", maxlength: STEP_TEXT_MAX });
      const reasonInput = el("input", { id: "node-reason", maxlength: STEP_TEXT_MAX });
      // The same node drawn again (a refresh, a status change) keeps what the person typed and
      // where the cursor was: a redraw must not wipe a half-written reason.
      const typed = nodeDetail.getAttribute("data-node") === id ? typedIn(nodeDetail) : null;
      fill(nodeDetail,
        el("h3", { id: "node-detail-title" }, "Node ", el("code", {}, node.id)),
        facts([["Title", node.title], ["Actor", node.actor], ["Status", badge(node.status)],
          ["Description", node.description || "—"], ["Evidence", node.evidence || "—"],
          // The records (or a succeeded write's receipt) a completed node rests on: the ids the
          // Evidence and Receipts sections list.
          ["Cites", citedBy(node)],
          ["Reason", node.reason || "—"], ["Action", node.action_id ? el("code", {}, node.action_id) : "—"],
          ["Retried by", node.status === "failed" ? retriesOf(node) : undefined]]),
        human ? stillSending(el("form", { id: "human-node", onsubmit: (e) => e.preventDefault() },
          el("h3", {}, "Human step"), byField("node-by"),
          el("label", { for: "node-evidence" }, "Evidence (to complete)"), evidenceInput,
          el("div", { class: "row" },
            el("button", { type: "button", id: "node-complete", onclick: () => {
              if (!evidenceInput.value.trim()) { fill(result, el("span", { class: "error" }, "Evidence is needed to complete.")); return; }
              finish("complete", { evidence: evidenceInput.value.trim() }); } }, "Complete")),
          el("label", { for: "node-reason" }, "Reason (to fail or skip)"), reasonInput,
          el("div", { class: "row" },
            el("button", { type: "button", class: "danger", id: "node-fail", onclick: () => {
              if (!reasonInput.value.trim()) { fill(result, el("span", { class: "error" }, "A reason is needed.")); return; }
              finish("fail", { reason: reasonInput.value.trim() }); } }, "Fail"),
            el("button", { type: "button", class: "secondary", id: "node-skip", onclick: () => {
              if (!reasonInput.value.trim()) { fill(result, el("span", { class: "error" }, "A reason is needed.")); return; }
              finish("skip", { reason: reasonInput.value.trim() }); } }, "Skip"))), stepKey)
          : closedHere ? el("p", { class: "notice", id: "node-not-here" }, closedHere)
          : open ? cannot("operator", "closing a human step") : null,
        result);
      if (s.nodeDone && s.nodeDone.id === id) fill(result, s.nodeDone.text);
      nodeDetail.setAttribute("data-node", id);
      if (typed) restoreTyped(nodeDetail, typed);
      nodeDetail.hidden = false;
      if (focus) nodeDetail.focus();
    }

    // What the next generation continues from (seed 000): the calls of the last round that
    // stopped, those with a result and those whose outcome is unknown (verified read-only first,
    // never sent again by the host).
    function renderRecovery(r) {
      if (r === undefined) return notice("Not available on this server.");
      if (!r) return el("p", { class: "muted" }, "No earlier round to continue from.");
      const done = r.done || [], unknown = r.unknown || [];
      const row = (x) => typeof x === "string" ? [unreadable(x), "—", "—", "—", "—", "—"] : [
        el("code", {}, String(x.call_id)), String(x.tool), String(x.turn), badge(String(x.status), true),
        x.invocation_id ? el("code", {}, String(x.invocation_id)) : "—", x.why || "—"];
      return [facts([["Generation", r.generation == null ? "—" : String(r.generation)], ["Why it stopped", r.reason || "—"]]),
        unknown.length ? notice(r.verify_first || "Verify these calls read-only before any retry.") : null,
        done.length || unknown.length
          ? table(["Call", "Tool", "Turn", "Status", "Receipt", "Why unknown"], [...unknown, ...done].map(row))
          : el("p", { class: "muted" }, "No tool call of that round had returned.")];
    }

    // What reached the business backend: approved actions and task events (the outbox). A
    // dead-lettered one waits for an operator's retry or discard, and the task's later events
    // behind it.
    function renderDeliveries(d) {
      if (d === undefined) return notice("Not available on this server.");
      const counts = (d && d.counts) || {};
      const line = (kind) => {
        const byStatus = counts[kind] || {};
        const parts = ["delivered", "pending", "dead", "discarded"].filter((x) => byStatus[x]).map((x) => `${x} ${byStatus[x]}`);
        return parts.length ? parts.join(" · ") : "none";
      };
      if (!Object.keys(counts).length) return el("p", { class: "muted" }, "Nothing was sent to the business backend yet.");
      const open = (d && d.undelivered) || [];
      const dead = open.filter((x) => x.status === "dead" || isFailing(x));
      // Pending with no attempt, and no row of the kind in the store sent: no dispatcher
      // sends that kind (its URL unset, most likely), which is not a stuck dispatcher. The
      // server cannot see the fleet's settings, so the note says what the store shows.
      const neverSent = ((d && d.never_sent) || []).map((kind) => el("p", { class: "muted never-sent" },
        `No ${kind === "action" ? "approved action" : "task event webhook"} in this store was delivered, dead-lettered or tried (delivered ones are kept ORCH_RETENTION_DAYS): ` +
        `they wait until ${kind === "action" ? "ORCH_ACTIONS_URL" : "ORCH_WEBHOOK_URL"} is set where the sweeper or outbox dispatcher runs.`));
      return [facts([["Approved actions", line("action")], ["Task events", line("webhook")]]), neverSent,
        open.length ? table(["Delivery", "What", "Status", "Attempts", "Next attempt", "Last error", ""], open.map((x) => [
          el("code", {}, String(x.outbox_id)),
          deliveryWhat(x), badge(x.status), x.attempts ? deliveryAttempts(x) : ["none yet, written ", when(x.created_at)],
          // Due, but held in order behind a dead letter: not a stuck dispatcher.
          x.waits_behind ? el("span", { class: "waits-behind" }, `waits behind dead letter ${x.waits_behind}`)
            : x.waits_behind_retried ? waitsBehindRetried(x)
            : isBeingSent(x) ? beingSentNow(x)
            : x.status === "pending" ? when(x.next_attempt_at) : "—",
          deliveryError(x),
          deadControls(x, opResult, refresh)])) : null,
        moreUndelivered(counts, open.length),
        dead.length && !can("operator") ? cannot("operator", "retrying or discarding a delivery") : null];
    }
    // The view lists the first 20 undelivered rows, dead ones first (`tasks show` says "... 20 of
    // the N not delivered shown"): the page cut there without a word. It says so, and leads to
    // the deliveries view of this task's dead and pending rows, which lists them all.
    function moreUndelivered(counts, shown) {
      const open = { dead: 0, pending: 0 };
      for (const byStatus of Object.values(counts)) for (const x of Object.keys(open)) open[x] += byStatus[x] || 0;
      const total = open.dead + open.pending;
      if (total <= shown) return null;
      const links = Object.entries(open).filter(([, n]) => n).map(([x, n], i) => [i ? ", " : "",
        el("a", { href: `#/deliveries?${new URLSearchParams({ status: x, task: taskId })}` }, `all ${n} ${x}`)]);
      return el("p", { class: "notice", id: "deliveries-more" },
        `${shown} of the ${total} not delivered are shown, dead ones first: `, links, ".");
    }

    async function loadPending() {
      // As for the view (refresh): a slow read answered after a newer one drew the actions as
      // they were, a decided one back with its buttons, and kept them while the view held.
      const asked = ++s.pendingAsked;
      const result = await pendingActions(`&task_id=${encodeURIComponent(taskId)}`, s.heldActions);
      if (!here() || asked < s.pendingDrawn) return;
      s.pendingDrawn = asked;
      s.pendingStale = !result.ok;
      // A read that failed said nothing: an empty section read as nothing waiting. It is said,
      // the cards shown (if any) kept as last read, and read again at the next poll or Retry.
      if (!result.ok) {
        const failed = readFailed("pending-error", "The pending approvals", result, loadPending);
        const shown = pendingRead.firstChild;
        if (!shown || shown.textContent !== failed.textContent || shown.querySelector("button:disabled")) fill(pendingRead, failed);
        return;
      }
      fill(pendingRead);
      if (result.unchanged) return; // the cards shown still hold
      showActions(pending, result.items, refresh, pendingResult);
    }

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

    // Drawn again only when they changed, or the clock changed what a row offers (a claim's
    // hold ran out): a retry button is not redrawn under the pointer.
    function drawDeliveries(task) {
      const d = task.deliveries;
      const deliveryKey = JSON.stringify([d === undefined ? "missing" : d, deliveryClock(d && d.undelivered)]);
      if (deliveryKey !== s.deliveryKey) {
        s.deliveryKey = deliveryKey;
        const typed = typedIn(deliveries); // a discard reason being typed survives a redraw
        fill(deliveries, renderDeliveries(d));
        restoreTyped(deliveries, typed);
      }
    }

    async function refresh() {
      // The poll and the stream's refresh often overlap: on a slow API the older answer came
      // last and drew the task as it was (a finished task running again) until the next poll.
      const asked = ++s.asked;
      const result = await watched(s.held, path);
      if (!here() || asked < s.drawn) return;
      s.drawn = asked;
      if (result.unchanged) { if (s.task) drawDeliveries(s.task); } // as shown, unless by the clock
      else if (result.ok) showTask(result.data);
      else if (result.status === 404 && !s.task) {
        // A mistyped or stale link: nothing to requeue, cancel or follow, so no form offered and
        // no "connecting" plan left waiting for a stream that never opens.
        handle.dispose();
        fill(main, el("p", {}, el("a", { href: "#/" }, "← Tasks")), el("h1", {}, "Task"),
          el("p", { class: "error", id: "task-error" }, "No such task: ", el("code", {}, taskId), "."));
        return;
      } else if (!result.down) fill(head, el("h1", {}, "Task"), el("p", { class: "error", id: "task-error" }, errorText(result)));
      // The view's tag covers the task's pending actions (a new one, a decision, a supersede:
      // store/task_versions.py): while the view is unchanged so are they, and an idle tab asks
      // one thing per poll, not two. Asked again after a read of them that failed.
      if (!result.unchanged || s.pendingStale) loadPending();
    }

    // Live updates: the task stream when the server has it, else the session's plan stream.
    function finished() {
      return s.ended || Boolean(s.task && FINAL_STATUSES.has(s.task.status));
    }
    function endStream() {
      // A finished task's stream ends for good: stop, and say so instead of "reconnecting".
      if (s.stream) s.stream.close();
      s.stream = null;
      clearTimeout(s.retry);
      live.className = "live off";
      live.textContent = "ended";
    }
    function onEvent(event) {
      if (!here()) return; // an event the closed stream had queued
      let data = null;
      try { data = JSON.parse(event.data); } catch (_) { return; }
      if (data && typeof data.status === "string" && FINAL_STATUSES.has(data.status)) s.ended = true;
      setLive(true);
      if (data && Array.isArray(data.execution_plans)) showPlan(data.execution_plans[data.execution_plans.length - 1]);
      else if (data && Array.isArray(data.nodes)) showPlan(data);
      else if (data && data.plan && Array.isArray(data.plan.nodes)) showPlan(data.plan);
      if (s.streamKind === "task" || event.type !== "state") scheduleRefresh();
    }
    let pendingRefresh = null;
    function scheduleRefresh() {
      if (pendingRefresh) return;
      pendingRefresh = setTimeout(() => { pendingRefresh = null; refresh(); }, 250);
    }
    function setLive(on) {
      live.className = `live ${on ? "on" : "off"}`;
      live.textContent = on ? "live" : "reconnecting";
    }
    async function openStream() {
      if (!here() || s.stream) return;
      let url = null;
      const probe = new AbortController();
      try {
        const response = await fetch(`${API}${path}/stream`, { credentials: "same-origin", signal: probe.signal });
        if (response.ok && (response.headers.get("content-type") || "").startsWith("text/event-stream")) {
          url = `${API}${path}/stream`;
          s.streamKind = "task";
        }
      } catch (_) { /* down: the poll shows it */ }
      probe.abort();
      if (!url && s.task && s.task.session_id) {
        url = `${API}agent/chat/session/${encodeURIComponent(s.task.session_id)}/stream`;
        s.streamKind = "session";
        s.streamSession = s.task.session_id;
      }
      if (!here() || s.stream) return;
      if (!url) { fill(live, "waiting for a session"); return; }
      const stream = new EventSource(url, { withCredentials: true });
      s.stream = stream;
      for (const name of ["state", "execution_plan", "plan", "task", "status", "execution", "action", "report", "evidence", "node"]) {
        stream.addEventListener(name, onEvent);
      }
      stream.onmessage = onEvent;
      stream.onopen = () => setLive(true);
      stream.onerror = () => {
        if (finished()) { endStream(); return; }
        setLive(false);
        if (stream.readyState === EventSource.CLOSED) {
          // Refused, not dropped: a 204 (the task finished and we saw its last event) or a 404.
          // Look at the task again before opening anything: a finished one stays shown, ended.
          stream.close();
          if (s.stream === stream) s.stream = null;
          clearTimeout(s.retry);
          scheduleRefresh();
          s.retry = setTimeout(() => { if (!finished()) openStream(); }, 2000);
        }
      };
    }

    function loadRecords() {
      loadEvidence();
      loadTranscript();
    }

    refresh();
    loadRecords();
    s.timer = setInterval(() => {
      refresh();
      if (s.stream === null && s.task && !finished()) openStream();
    }, POLL_MS);
    let slow = setInterval(loadRecords, POLL_MS * 5);
    const handle = {
      dispose() {
        s.alive = false;
        clearInterval(s.timer);
        clearInterval(slow);
        clearTimeout(s.retry);
        clearTimeout(pendingRefresh);
        if (s.stream) s.stream.close();
        if (s.graph && s.graph.dispose) s.graph.dispose();
      },
    };
    return handle;
  }

  // ---- start -----------------------------------------------------------------------------
  // Who is signed in decides what is offered, so it is known before the first view.
  fetch("console/session", { credentials: "same-origin" })
    .then((r) => { sampleClock(r); return r.json(); }) // the server's clock, before any view
    .then((state) => { me = state.account || null; showAccount(state); })
    .catch(() => {})
    .finally(() => {
      window.addEventListener("hashchange", render);
      render();
    });
})();
