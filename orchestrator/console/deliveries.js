/* Deliveries to the business backend (the outbox): the view of every task's (#/deliveries),
 * and the pieces of a row a task's page draws too (status, Retry, Discard). */
import { byField, can, cannot, named, operator, remember } from "./account.js";
import { errorText, missingRoute, sendOnce, stillSending, watched } from "./api.js";
import { now, when } from "./clock.js";
import { badge, el, fill } from "./text.js";
import { POLL_MS, main, shownAt, viewKey } from "./views.js";
import { itemsOf, restoreTyped, table, typedIn } from "./widgets.js";

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
    ? `Delivery ${id} is claimed by a dispatcher and waits its turn in its batch: it is posted when its turn comes, and a retry would not send it sooner; discard it if it must not be sent.`
    : `Delivery ${id} is being sent now: its answer is recorded when the attempt ends; ${what} it then if it failed.`;
}
// A dispatcher holds a pending row while it sends it (`claimed_until`, in the future): a
// time past is a dispatcher that stopped mid-send, and the row is due again.
export function isBeingSent(x) {
  return x.status === "pending" && Boolean(x.claimed_until) && new Date(x.claimed_until).getTime() > now();
}
// What of the rows shown changes with the clock alone: a claim's hold runs out (a dispatcher
// stopped mid-send: due again), a backoff ends. The list's tag and its rows stay the same
// then, so a view drawn once kept saying "being sent now", with no Retry, until a reload.
export function deliveryClock(rows) {
  return (rows || []).map((x) => `${isBeingSent(x) ? 1 : 0}${isFailing(x) ? 1 : 0}`).join();
}
// A dispatcher claims a batch of rows and posts them one after another, recording when it
// posts each (`sending_since`): the others of the batch wait their turn, held as well. Every
// row of a batch read "being sent now". (A dispatcher older than `sending_since` records no
// post: its rows read as waiting their turn.)
export function beingSentNow(x) {
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
export function isFailing(x) {
  return x.status === "pending" && Boolean(x.attempts || x.last_error) && !x.waits_behind && !x.waits_behind_retried
    && Boolean(x.next_attempt_at) && new Date(x.next_attempt_at).getTime() > now();
}
// What is done about a dead letter or a failing delivery: retried, or discarded. A row posted
// now offers neither (the API refuses both, `409 being_sent`). One claimed in a dispatcher's
// batch and waiting its turn (held, not posted) can be discarded: the dispatcher checks the row
// again before it posts it and skips it. A retry would not send it sooner, and is refused.
export function deadControls(x, say, after) {
  if (!can("operator")) return "";
  if (waitsItsTurn(x)) return [discardForm(x, say, after)];
  return (x.status === "dead" || isFailing(x)) && !isBeingSent(x) ? [retryButton(x, say, after), discardForm(x, say, after)] : "";
}
function waitsItsTurn(x) {
  return isBeingSent(x) && !x.sending_since;
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
export function deliveryError(x) {
  return [x.last_error || "—", deadReason(x), retriedBy(x), x.status === "discarded"
    ? el("p", { class: "muted discarded" }, `discarded by ${x.discarded_by || "?"} `, when(x.discarded_at),
      x.discarded_from === "pending" ? " (it was pending, not dead-lettered)" : "", `: ${x.discard_reason || "—"}`) : null];
}
export function deliveryWhat(x) {
  return x.kind === "action" ? ["action ", el("code", {}, x.action_id || "?")] : ["event ", el("code", {}, x.event_id || "?")];
}
export function deliveryAttempts(x) {
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
export function waitsBehindRetried(x) {
  return el("span", { class: "waits-behind" }, `waits behind delivery ${x.waits_behind_retried}, being retried`);
}

// Every delivery of a status (dead by default) and kind, across tasks, oldest first.
const DELIVERY_STATUSES = ["dead", "pending", "delivered", "discarded"];
export function deliveryList(params) {
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
