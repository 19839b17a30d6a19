/* The API of the same origin: reads (polled ones with their ETag), writes sent once per click,
 * and what is said when either fails. */
import { sampleClock } from "./clock.js";
import { el, fill } from "./text.js";

export const API = "api/v1/";
const banner = document.getElementById("banner");

// ---- the API ---------------------------------------------------------------------------
export function showBanner(text) {
  if (text) { fill(banner, text); banner.hidden = false; }
  else if (!banner.hidden) { banner.hidden = true; fill(banner); }
}
// A read unanswered after this long is given up and said as the API not answering: an API
// that took the connection and never answered (its process stopped, a proxy or a network
// holding the request) left every poll waiting for ever, and the page showed the last rows
// read as if fresh, their "(N min ago)" ticking on. A write is never given up (the API may
// still apply it): its buttons wait, and the banner says the API has not answered yet.
export const READ_TIMEOUT_MS = 10_000;
const UNANSWERED = `The API is not answering (nothing in ${READ_TIMEOUT_MS / 1000} s); retrying…`;
export async function api(method, path, body, signal, tag) {
  const read = method === "GET";
  const timeout = read ? AbortSignal.timeout(READ_TIMEOUT_MS) : null;
  const init = { method, credentials: "same-origin", headers: { "X-Orch-Console": "1" },
    signal: timeout ? (signal ? AbortSignal.any([signal, timeout]) : timeout) : signal };
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
  const slow = read ? null : setTimeout(() => showBanner(`The API has not answered this ${method} in ${READ_TIMEOUT_MS / 1000} s yet; waiting for it…`), READ_TIMEOUT_MS);
  try {
    response = await fetch(API + path, init);
  } catch (error) {
    if (timeout && timeout.aborted) return unanswered();
    if (error && error.name === "AbortError") throw error;
    showBanner("The API is not answering; retrying…");
    return { ok: false, status: 0, data: null, down: true };
  } finally {
    clearTimeout(slow);
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
  try { data = await response.json(); } catch (_) {
    if (timeout && timeout.aborted) return unanswered(); // the body never came
    data = null;
  }
  return { ok: response.ok, status: response.status, data, tag: response.headers.get("ETag") };
}
function unanswered() {
  showBanner(UNANSWERED);
  return { ok: false, status: 0, data: null, down: true };
}
// A GET polled again and again: the tag and answer held of each path (in `held`, a Map the
// view owns) are sent as If-None-Match; a 304 gives back the answer held, marked unchanged.
export async function watched(held, path) {
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
export async function sendOnce(control, method, path, body, key = control) {
  if (!control || sending.has(key)) return null;
  const drawn = new Set([control]);
  sending.set(key, drawn);
  holdControl(control, true);
  try { return await api(method, path, body); } finally {
    sending.delete(key);
    for (const each of drawn) holdControl(each, false);
  }
}
export function stillSending(control, key) {
  const drawn = sending.get(key);
  if (drawn) { drawn.add(control); holdControl(control, true); }
  return control;
}
export function errorText(result) {
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
export function readFailed(id, what, result, again) {
  const text = `${what} could not be read: ${errorText(result).replace(/\.$/, "")}. `;
  return el("p", { class: "error read-failed", id, role: "alert" }, text,
    el("button", { type: "button", class: "secondary", onclick: (event) => {
      event.currentTarget.disabled = true; // until the read's answer draws this again
      again();
    } }, "Retry"));
}
export function missingRoute(result) {
  // No such route: FastAPI's own 404 ("Not Found"), or a path that exists for other methods.
  const error = result.data && result.data.error;
  return result.status === 405 || (result.status === 404 && (!error || error.message === "Not Found"));
}
