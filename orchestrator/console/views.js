/* What every view shares: where it draws, how often it polls, and which view the address
 * names (a view draws only while the address still names it). */

export const main = document.getElementById("main");
export const POLL_MS = 3000;

// ---- routing -------------------------------------------------------------------------
export function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { path, params: new URLSearchParams(query || "") };
}
// The task a `#/task/ID` address names, or null.
export function taskOf(path) {
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
export function viewKey() {
  const { path } = route();
  const task = taskOf(path);
  return task !== null ? `task:${task}` : VIEWS.includes(path) ? path : `unknown:${path}`;
}
// Whether the view opened as `key` is still the one the address names. A hash-only
// navigation changes the address at once but tells the page (`hashchange`, which disposes
// the view) a task later: an answer of the view left that landed in between was drawn, and
// the task page then wrote its own address back over the new one (keepInAddress), so the
// view the operator asked for never showed. Every view checks this before it draws.
export function shownAt(key) { return viewKey() === key; }
// The router (app.js) draws the view the address names; a view drawn again at the same address
// (the task list's Filter pressed twice) asks for it here: no view imports the router.
let router = null;
export function setRouter(draw) { router = draw; }
export function redraw() { router(); }
