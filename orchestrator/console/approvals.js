/* Actions that wait for a decision: the approvals view (#/approvals), and the cards a task's
 * page draws for its own. */
import { byField, can, cannot, remember } from "./account.js";
import { api, errorText, readFailed, sendOnce, watched } from "./api.js";
import { when } from "./clock.js";
import { badge, el, fill } from "./text.js";
import { POLL_MS, main, shownAt, viewKey } from "./views.js";
import { facts, itemsOf, json, unreadable } from "./widgets.js";

// ---- actions (approvals) ---------------------------------------------------------------
// The pending actions in `list`, one card each, as the API lists them. A card still pending
// stays the same element: a poll that found a new action (or one decided elsewhere) used to
// draw every card again, wiping the name and note an approver was typing and the focus.
// Cards already shown keep their order, so none is moved (a moved element loses focus).
// Oldest first (the API lists newest first): one proposed meanwhile is added at the end, not
// on top, where it pushed the card being decided down under the pointer.
export function showActions(list, newestFirst, after, say) {
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
      // Decided or superseded meanwhile (a requeue, a cancel, another approver), or gone: the
      // card is stale. Said where it stays, and the list read again: the card went on reading
      // pending_approval with its buttons, and the next poll took it away with the only word
      // of what had happened.
      if ((result.status === 409 || result.status === 404) && say) {
        fill(say, el("span", { class: "error" }, `Not ${verb === "approve" ? "approved" : "rejected"}: ${action.kind || "action"} for node ${action.node_id} of task ${action.task_id}: ${errorText(result)}`));
        if (after) after();
      }
    }
  }
  return el("article", { class: "card action", "data-action": action.action_id },
    el("h3", {}, `${action.kind || "action"} for node `, el("code", {}, action.node_id)),
    facts([["Status", badge(action.status)],
      ["Task", taskOf(action)], ["Node", nodeOf(action)],
      ["Step", action.node && action.node.description ? el("span", { class: "action-step" }, action.node.description) : undefined],
      ["Generation", String(action.generation)], ["Proposed", when(action.created_at)],
      ["Digest", action.digest ? el("code", { class: "digest" }, action.digest) : el("span", { class: "muted" }, "not provided by this server")]]),
    el("h3", {}, "Payload"), typeof action.payload === "string" ? unreadable(action.payload) : json(action.payload),
    action.status === "pending_approval" && !can("approver") ? cannot("approver", "deciding on an action") :
    action.status === "pending_approval" ? el("form", { class: "inline", onsubmit: (e) => e.preventDefault() },
      el("div", {}, byField(byId)),
      el("div", {}, el("label", { for: note.id }, "Note"), note),
      el("button", { type: "button", class: "approve", onclick: (event) => decide("approve", event) }, "Approve"),
      el("button", { type: "button", class: "danger reject", onclick: (event) => decide("reject", event) }, "Reject"))
      : facts([["Decided by", action.decided_by], ["Decided", action.decided_at ? when(action.decided_at) : undefined],
        ["Note", action.note], ["Delivery", action.status === "approved" ? deliveryOf(action.delivery) : undefined]]),
    message);
}
// Which task the action would act for, by its title: cards of two incidents proposing the same
// work order differed only by a task id, and an approver could not tell them apart.
function taskOf(action) {
  const link = `#/task/${encodeURIComponent(action.task_id)}`;
  return el("span", { class: "action-task" }, action.task_title
    ? [el("a", { href: link }, action.task_title), " (", el("code", {}, action.task_id), ")"]
    : el("a", { href: link }, action.task_id));
}
// The node it serves, as the plan it was proposed under drew it: its title, status and why it
// waits (the API's `node`; no row from a server without it).
function nodeOf(action) {
  if (action.node === undefined) return undefined;
  if (!action.node) return el("span", { class: "action-node muted" }, `${action.node_id}: not in the plan it was proposed under`);
  const n = action.node;
  return el("span", { class: "action-node" }, `${n.title || action.node_id} (${action.node_id})`,
    n.status ? `, ${n.status}` : "", n.reason ? `: ${n.reason}` : "");
}
// Where an approved action's delivery to the business backend stands (the API's `delivery`):
// read as delivered only when it was.
function deliveryOf(delivery) {
  if (delivery === undefined) return "not available on this server";
  if (!delivery) return el("span", { class: "muted" }, "not written yet");
  const at = delivery.status === "delivered" && delivery.delivered_at ? [" ", when(delivery.delivered_at)] : "";
  const tried = delivery.status !== "delivered" && delivery.attempts ? ` (${delivery.attempts} attempt(s))` : "";
  // Why it is not delivered yet, and when it is tried again: "pending (3 attempt(s))" alone
  // read as on its way while the backend answered 500 to every attempt.
  const open = delivery.status === "pending" || delivery.status === "dead";
  const error = open && delivery.last_error ? [", ", el("span", { class: "delivery-error" }, `last error: ${delivery.last_error}`)] : "";
  const next = delivery.status === "pending" && delivery.attempts && delivery.next_attempt_at
    ? [", ", el("span", { class: "delivery-next" }, "next attempt ", when(delivery.next_attempt_at))] : "";
  return el("span", { class: "delivery" }, badge(delivery.status), at, tried, error, next, ` · outbox ${delivery.outbox_id}`);
}

// The task's decided actions (approved, rejected, superseded), newest first, with who decided,
// the note and, for an approved one, its delivery: once decided an action left the task's page,
// and nothing there said who approved the work order or whether the backend had it. The
// `wanted` newest, a page of the API at a time (`decided=true`, by its cursor): the 200 newest
// were all the page had, with no way to reach an older decision.
export const DECIDED_PAGE = 20;
export async function decidedActions(taskId, held, wanted) {
  const result = await firstOf(`actions?decided=true&task_id=${encodeURIComponent(taskId)}`, wanted, held);
  if (!result.ok) return result;
  // Never drawn as decided, whatever a server sends.
  return { ...result, items: result.items.filter((a) => a.status !== "pending_approval") };
}
export function showDecided(list, items) {
  fill(list, items.length ? items.map((a) => actionCard(a, null, null))
    : el("p", { class: "muted" }, "No action of this task was decided yet."));
}

// Every pending action (of one task, with `filter` "&task_id=..."), page after page: the API
// lists newest first, so one page of 100 hid the oldest, the longest waiting, whenever more
// than 100 were pending. The failed answer if a page fails. With `held` (a Map the view owns,
// as for `watched`) each page's tag is sent, and `unchanged` says that every page was a 304:
// an open task's pending actions are polled every 3 s, nearly always unchanged.
export async function pendingActions(filter, held) {
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

// The first `wanted` actions of the list `base` (a query of GET /api/v1/actions, without
// `limit` and `cursor`), a page of the API at a time, each with the tag held of it (`held`, as
// for `watched`): `unchanged` when every page was a 304, `more` when the list goes on.
async function firstOf(base, wanted, held) {
  const items = [];
  let cursor = null, unchanged = true;
  do {
    const limit = Math.min(200, wanted - items.length);
    const query = `${base}&limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const result = await watched(held, query);
    if (!result.ok) return result;
    unchanged = unchanged && Boolean(result.unchanged);
    items.push(...itemsOf(result.data));
    cursor = result.data.next_cursor || null;
  } while (cursor && items.length < wanted);
  return { ok: true, items, more: Boolean(cursor), unchanged };
}

// The oldest `wanted` pending actions, oldest first.
function oldestPending(wanted, held) {
  return firstOf("actions?status=pending_approval&order=oldest", wanted, held);
}

// How many wait (the API's count) and the oldest of them, a page more at each "Show more".
// A refresh reads the count and the cards shown: with thousands pending, every refresh
// fetched all of them, page after page, and drew a card for each.
const APPROVALS_PAGE = 50;
export function approvals() {
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
    // The count's own read may fail while the cards are read: its line was left blank.
    const pending = counted.ok ? counted.data.pending : null;
    fill(count, pending === null
      ? `How many are pending could not be read: ${errorText(counted).replace(/\.$/, "")}. ${result.items.length} shown, the longest waiting first.`
      : result.more
        ? `${pending} pending; the ${result.items.length} oldest are shown, the longest waiting first.`
        : `${pending} pending.`);
  }
  load();
  const timer = setInterval(load, POLL_MS * 2);
  return { dispose() { alive = false; clearInterval(timer); } };
}
