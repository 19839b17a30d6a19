/* Who is signed in (GET console/session), what the role may do, and the name a write is
 * recorded under. */
import { el, fill } from "./text.js";

// The most characters of who acted (`by`): orchestrator.domain.storable.NAME_MAX, as the API
// takes it (tests/unit/test_text_limits.py holds the two equal).
export const NAME_MAX = 128;

let me = null; // the signed-in account {name, role, shared}; null when unknown
const ROLES = ["viewer", "operator", "approver"];

// ---- who is signed in ---------------------------------------------------------------
export function can(role) {
  // Unknown (the session answer failed): offer everything; the API decides.
  return !me || ROLES.indexOf(me.role) >= ROLES.indexOf(role);
}
export function named() { return Boolean(me && !me.shared); }
export function cannot(role, what) {
  return el("p", { class: "notice role-note" },
    `Signed in as ${me ? me.name : "?"} (${me ? me.role : "?"}): ${what} needs the ${role} role.`);
}
export function operator() { return localStorage.getItem("orch.by") || ""; }
export function byField(id, optional = false) {
  // A named account acts as itself (the API records its name); the shared token asks.
  if (named()) {
    return [el("input", { type: "hidden", id, name: "by", value: me.name }),
      el("p", { class: "muted acting-as" }, `Acting as ${me.name}`)];
  }
  return [el("label", { for: id }, optional ? "Your name (recorded with it)" : "Your name"),
    el("input", { id, name: "by", required: !optional, maxlength: NAME_MAX, value: operator(), autocomplete: "name" })];
}
export function remember(by) { if (by && !named()) localStorage.setItem("orch.by", by); }
function showAccount(state) {
  document.getElementById("signout").hidden = !state.required;
  const who = document.getElementById("whoami");
  if (!state.required || !me) { who.hidden = true; return; }
  fill(who, me.shared ? "Signed in with the API token" : ["Signed in as ", el("strong", { id: "whoami-name" }, me.name)],
    el("span", { class: "role", id: "whoami-role" }, me.role));
  who.hidden = false;
}

// The session's answer, read before the first view (app.js).
export function signedIn(state) {
  me = state.account || null;
  showAccount(state);
}
