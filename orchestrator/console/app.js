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
import { byField, can, cannot, remember, signedIn } from "./account.js";
import { API, api, errorText, missingRoute, readFailed, sendOnce, showBanner, stillSending, watched } from "./api.js";
import { approvals, pendingActions, showActions } from "./approvals.js";
import { sampleClock, when } from "./clock.js";
import { beingSentNow, deadControls, deliveryAttempts, deliveryClock, deliveryError, deliveryList, deliveryWhat, isBeingSent, isFailing, waitsBehindRetried } from "./deliveries.js";
import { countsOf, olderParts, planGraph, retriesIn } from "./graph.js";
import { taskList } from "./tasks.js";
import { append, badge, el, fill } from "./text.js";
import { POLL_MS, main, route, setRouter, shownAt, taskOf, viewKey } from "./views.js";
import { facts, handedBack, isObject, itemsOf, json, lastWrite, nodesOf, notice, restoreTyped, table, typedIn, unreadable, wakeUpUnsent } from "./widgets.js";

const FINAL_STATUSES = new Set(["completed", "failed", "cancelled"]);
const NODE_DONE = ["completed", "failed", "skipped", "cancelled"];
const STEP_TEXT_MAX = 1500; // a human step's evidence or reason, as the API takes it
let view = null; // the current view's {dispose}

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
  .then(signedIn)
  .catch(() => {})
  .finally(() => {
    setRouter(render);
    window.addEventListener("hashchange", render);
    render();
  });
