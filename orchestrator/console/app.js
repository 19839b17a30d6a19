/* The operator console: plain JavaScript, no framework, no build step.
 *
 * Everything the model or an operator wrote (titles, plans, reports, payloads, transcripts) is
 * put into the page as text nodes (textContent), never as HTML, by `append` (and `shown` for
 * the few attributes and SVG text a person reads): both draw each bidirectional control and
 * zero-width character as a visible marker instead of letting it reorder or hide the text.
 * Calls go to the API of the same origin with the session cookie; writes carry
 * X-Orch-Console: 1. Routes that a server may not have yet (evidence, transcript, task stream,
 * human nodes) show "not available on this server" when they answer 404.
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
 *
 * ES modules, one job each, that the API serves as this one (orchestrator/api/console.py names
 * them): text.js (text and elements), clock.js (times, the server's clock), api.js (the API,
 * writes sent once), account.js (who is signed in), widgets.js (shared pieces), views.js (which
 * view the address names), tasks.js, task.js (with task_plan.js, graph.js and records.js),
 * deliveries.js and approvals.js (the views). This one routes: it draws the view the address
 * names, once the session says who is signed in.
 */
import { signedIn } from "./account.js";
import { showBanner } from "./api.js";
import { approvals } from "./approvals.js";
import { sampleClock } from "./clock.js";
import { deliveryList } from "./deliveries.js";
import { taskDetail } from "./task.js";
import { taskList } from "./tasks.js";
import { el, fill } from "./text.js";
import { main, route, setRouter, taskOf } from "./views.js";

let view = null; // the current view's {dispose}

// ---- routing -------------------------------------------------------------------------
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

// ---- start -----------------------------------------------------------------------------
// Who is signed in decides what is offered, so it is known before the first view.
fetch("console/session", { credentials: "same-origin" })
  .then((r) => { sampleClock(r); return r.json(); }) // the server's clock, before any view
  .then(signedIn)
  .catch(() => {})
  .finally(() => {
    setRouter(render);
    window.addEventListener("hashchange", render);
    render();
  });
