/* Pieces every view draws: facts, tables, JSON, notices, a task's status notes, and what was
 * typed in a form drawn again. */
import { when } from "./clock.js";
import { el } from "./text.js";

export const FINAL_STATUSES = new Set(["completed", "failed", "cancelled"]);

export function lastWrite(value) {
  if (value === undefined) return undefined; // a server without `last_write`: no row
  if (!value) return "none in this generation";
  if (typeof value !== "object") return String(value);
  const at = value.at || value.time || value.written_at || value.created_at;
  return [value.kind || "write", " ", at ? when(at) : ""];
}
// A `running` task whose generation its worker handed back (a model server's Retry-After,
// an outage): no round runs until the sweeper requeues it, after `requeue_after`.
export function handedBack(task, id) {
  const wait = task.handed_back;
  if (!wait) return null;
  return el("span", { class: "handed-back", id: id || null, title: wait.reason || "" },
    " handed back", wait.requeue_after ? [", requeued after ", when(wait.requeue_after)] : "");
}
// Queued, and no worker was woken: the broker refused its wake-up (`wake_up_unsent`), and the
// task does not move until the sweeper sends it. The list said a plain "queued" of it.
export function wakeUpUnsent(task, id) {
  if (!task.wake_up_unsent) return null;
  const why = "the sweeper sends it once Redis takes messages again";
  return id ? el("span", { class: "muted", id }, ` wake-up not sent (Redis refused it); ${why}`)
    : el("span", { class: "muted wake-up-unsent", title: why }, " wake-up not sent (Redis refused it)");
}
export function facts(pairs) {
  return el("dl", { class: "facts" },
    pairs.filter(([, v]) => v !== undefined).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "—")]));
}
export function json(value) {
  return el("pre", {}, JSON.stringify(value, null, 2));
}
// A part of a record an older version stored in another shape: the API sends it as its JSON
// text (api/older_shapes.py), shown as written and marked, never read as today's shape.
export function unreadable(text) {
  return el("pre", { class: "unreadable", title: "stored by an older version in another shape" }, String(text));
}
export function isObject(value) { return value !== null && typeof value === "object" && !Array.isArray(value); }
// The nodes and edges of a plan that have today's shape (the others are text).
export function nodesOf(plan) { return (plan.nodes || []).filter(isObject); }
export function edgesOf(plan) { return (plan.edges || []).filter(isObject); }
export function notice(text) {
  return el("p", { class: "notice" }, text);
}
export function table(columns, rows, cls) {
  return el("div", { class: "scroll" }, el("table", { class: cls || "cards" },
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c)))),
    el("tbody", {}, rows.map((cells) => el("tr", {},
      cells.map((cell, i) => el("td", { "data-label": columns[i] }, cell)))))));
}
export function itemsOf(data) {
  if (!data) return [];
  for (const key of ["items", "tasks", "sessions", "actions", "evidence", "messages"]) {
    if (Array.isArray(data[key])) return data[key];
  }
  return Array.isArray(data) ? data : [];
}

// The values typed into a form's text fields and which of them had the focus, to put back
// after the form is drawn again (hidden fields are the console's own, not typed).
export function typedIn(box) {
  const fields = [...box.querySelectorAll("input[id]:not([type=hidden]), textarea[id]")];
  const active = fields.includes(document.activeElement) ? document.activeElement : null;
  return {
    values: Object.fromEntries(fields.map((f) => [f.id, f.value])),
    focused: active ? { id: active.id, start: active.selectionStart, end: active.selectionEnd } : null,
  };
}
export function restoreTyped(box, typed) {
  for (const field of box.querySelectorAll("input[id]:not([type=hidden]), textarea[id]")) {
    if (Object.hasOwn(typed.values, field.id)) field.value = typed.values[field.id];
  }
  const again = typed.focused && document.getElementById(typed.focused.id);
  if (again && box.contains(again)) {
    again.focus();
    if (typed.focused.start !== null) again.setSelectionRange(typed.focused.start, typed.focused.end);
  }
}
