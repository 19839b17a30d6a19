/* A task's page (#/task/ID): its state, lease, generations, report, receipts, recovery,
 * deliveries and pending approvals, polled and followed live; the plan (task_plan.js) and the
 * records (records.js) are sections of it. */
import { byField, can, cannot, named, remember } from "./account.js";
import { API, READ_TIMEOUT_MS, errorText, readFailed, sendOnce, watched } from "./api.js";
import { DECIDED_PAGE, decidedActions, pendingActions, showActions, showDecided } from "./approvals.js";
import { when } from "./clock.js";
import {
  beingSentNow,
  deadControls,
  deliveryAttempts,
  deliveryClock,
  deliveryError,
  deliveryWhat,
  isBeingSent,
  isFailing,
  waitsBehindRetried,
} from "./deliveries.js";
import { liveness } from "./liveness.js";
import { citation, finding, taskRecords } from "./records.js";
import { taskPlan } from "./task_plan.js";
import { badge, el, fill } from "./text.js";
import { POLL_MS, main, shownAt, viewKey } from "./views.js";
import {
  FINAL_STATUSES,
  facts,
  handedBack,
  lastWrite,
  notice,
  restoreTyped,
  table,
  typedIn,
  unreadable,
  wakeUpUnsent,
} from "./widgets.js";

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

// ---- task detail -----------------------------------------------------------------------
export function taskDetail(taskId, params) {
  const path = `tasks/${encodeURIComponent(taskId)}`;
  const s = { alive: true, key: viewKey(), asked: 0, drawn: 0, pendingAsked: 0, pendingDrawn: 0, transcriptAsked: 0, transcriptDrawn: 0, task: null, plan: null, selected: null, stream: null, timer: null, held: new Map(), heldActions: new Map(), heldDecided: new Map(), decidedAsked: 0, decidedDrawn: 0, decidedShown: DECIDED_PAGE,
    graph: null, streamKind: null, retry: null, nodeDone: null, receiptKey: null, recordsKey: null, deliveryKey: null,
    recoveryKey: null, probe: null };
  // A reload restores the revision and the node shown (#/task/ID?session=S&revision=N&node=X);
  // a revision of another session than the live plan's (a newer generation) is not restored.
  s.selected = params.get("node") || null;
  s.restore = params.get("session") && Number(params.get("revision")) >= 1
    ? { session: params.get("session"), revision: Number(params.get("revision")) } : null;
  // This page is open and the address still names it (see shownAt).
  const here = () => s.alive && shownAt(s.key);
  const part = (id) => el("div", { id });
  const head = part("task-head");
  const live = el("span", { class: "live off", id: "live" }, "connecting");
  const lease = part("lease"), generations = part("generations"), planBox = part("plan");
  const nodeDetail = el("div", { id: "node-detail", class: "node-detail", tabindex: "-1", hidden: true });
  const pending = el("div", { id: "pending-actions", class: "actions-list" });
  const pendingResult = el("p", { role: "status", id: "pending-result" });
  const pendingRead = el("div", { id: "pending-read" }); // says when they could not be read
  const decided = el("div", { id: "decided-actions", class: "actions-list" });
  const decidedRead = el("div", { id: "decided-read" });
  // Said when older decided actions than those shown are left to read, with a page more of them.
  const decidedShown = el("p", { class: "muted", id: "decided-shown", hidden: true });
  const decidedMore = el("button", { type: "button", class: "secondary", id: "decided-more", hidden: true,
    onclick: () => { s.decidedShown += DECIDED_PAGE; loadDecided(); } }, `Show ${DECIDED_PAGE} more`);
  const report = part("report"), receipts = part("receipts");
  const inFlight = part("running-receipts");
  const resolved = part("resolutions");
  const evidence = part("evidence"), transcript = part("transcript");
  const deliveries = part("deliveries"), recovery = part("recovery");
  const opResult = el("p", { role: "status", id: "op-result" });
  // Its sections of their own: the evidence and the transcript, the plan and its nodes.
  const { loadRecords, loadCited } = taskRecords({ path, s, here, evidence, transcript, opResult });
  const { showPlan, drawPlan, earlierNotice, loadEarlierPlan, showNode } = taskPlan({
    taskId, path, s, here, planBox, nodeDetail, refresh, loadCited,
  });

  function reasonForm(id, label, verb, cls) {
    const input = el("input", { id, name: "reason", required: true, maxlength: 500, placeholder: "reason" });
    // Signed in with the shared API token, the requeue or cancel named no one: the task's
    // generations said "requeued by an operator" while approvals asked the name. A named
    // account acts as itself (the API records its name).
    const byId = `${verb}-by`;
    // Hidden until the task's state is known (showTask): a finished task's page, slow to
    // load, offered Cancel until its first answer, and the API then said 409.
    return el("form", { class: "inline", id: `${verb}-form`, hidden: true, onsubmit: async (event) => {
      event.preventDefault();
      const reason = input.value.trim();
      if (!reason) { fill(opResult, el("span", { class: "error" }, "A reason is needed.")); return; }
      const body = { reason };
      const by = named() ? "" : document.getElementById(byId).value.trim();
      if (by) { body.by = by; remember(by); }
      const result = await sendOnce(event.currentTarget, "POST", `${path}/${verb}`, body);
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
    } }, named() ? null : el("div", {}, byField(byId, true)),
    el("div", {}, el("label", { for: id }, `${label} reason`), input),
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
    el("section", { class: "card", "aria-labelledby": "h-decided" }, el("h2", { id: "h-decided" }, "Decided actions"), decidedRead, decided, decidedShown, decidedMore),
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
    // Why each generation ran: a requeue of a finished task left generation 1 "completed"
    // and a generation 2 with no word of who requeued it or why.
    const queuedBecause = (x) => x.queued_because === undefined ? "—"
      : x.queued_because || (x.generation === 1 ? "triggered" : "—");
    fill(generations, executions.length ? table(["Generation", "Queued because", "Outcome", "Worker", "Started", "Ended", "Reason"],
      executions.slice().reverse().map((x) => [String(x.generation), queuedBecause(x),
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
    if (!result.unchanged || s.decidedStale) loadDecided();
  }

  // Who approved or rejected each action of the task, and where an approved one's delivery
  // stands: read with the pending ones (a decision, or a delivery attempt, changes the view).
  async function loadDecided() {
    const asked = ++s.decidedAsked;
    const result = await decidedActions(taskId, s.heldDecided, s.decidedShown);
    if (!here() || asked < s.decidedDrawn) return;
    s.decidedDrawn = asked;
    s.decidedStale = !result.ok;
    if (!result.ok) {
      fill(decidedRead, readFailed("decided-error", "The decided actions", result, loadDecided));
      return;
    }
    fill(decidedRead);
    if (result.unchanged) return; // the cards shown still hold
    showDecided(decided, result.items);
    // The newest are shown, a page more at each "Show more": the older ones are said to be there.
    decidedShown.hidden = decidedMore.hidden = !result.more;
    fill(decidedShown, result.more ? `The ${result.items.length} newest decided actions are shown; older ones follow.` : "");
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
    watch.stop();
    live.className = "live off";
    live.textContent = "ended";
  }
  function onEvent(event) {
    if (!here()) return; // an event the closed stream had queued
    let data = null;
    try { data = JSON.parse(event.data); } catch (_) { return; }
    if (data && typeof data.status === "string" && FINAL_STATUSES.has(data.status)) s.ended = true;
    // Every connection's `state` says how long the stream may be quiet.
    if (event.currentTarget === s.stream) heard(data && data.keepalive_seconds);
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
  // "live" only while the stream is heard from (liveness.js): an API that stopped answering
  // kept the marker lit, as its connection stayed open. Said, and the stream opened again
  // (a connection a proxy dropped without a word is never answered again).
  const watch = liveness((seconds) => {
    if (!here() || finished()) return;
    live.className = "live off";
    live.textContent = `live updates paused: nothing from the API in ${seconds} s; reconnecting`;
    if (s.stream) s.stream.close();
    s.stream = null;
    openStream();
  });
  function heard(keepalive) {
    watch.heard(keepalive);
    setLive(true);
  }
  function onKeepalive(event) {
    if (!here() || event.currentTarget !== s.stream) return;
    let data = null;
    try { data = JSON.parse(event.data); } catch (_) { /* heard all the same */ }
    heard(data && data.keepalive_seconds);
  }
  async function openStream() {
    // One probe at a time: on a hung API the 3-s poll sent one more each time, all left waiting.
    if (!here() || s.stream || s.probe) return;
    let url = null;
    let answered = false;
    const probe = new AbortController();
    s.probe = probe;
    try {
      // Given up as any read is (api.js): it had no timeout.
      const signal = AbortSignal.any([probe.signal, AbortSignal.timeout(READ_TIMEOUT_MS)]);
      const response = await fetch(`${API}${path}/stream`, { credentials: "same-origin", signal });
      answered = true;
      if (response.ok && (response.headers.get("content-type") || "").startsWith("text/event-stream")) {
        url = `${API}${path}/stream`;
        s.streamKind = "task";
      }
    } catch (_) { /* down or not answering: the poll says so, and asks again */ }
    probe.abort();
    if (s.probe === probe) s.probe = null;
    // Unanswered says nothing of the server's streams: not taken for one without the task's.
    if (!answered) return;
    if (!url && s.task && s.task.session_id) {
      url = `${API}agent/chat/session/${encodeURIComponent(s.task.session_id)}/stream`;
      s.streamKind = "session";
      s.streamSession = s.task.session_id;
    }
    if (!here() || s.stream) return;
    if (!url) { fill(live, "waiting for a session"); return; }
    const stream = new EventSource(url, { withCredentials: true });
    s.stream = stream;
    watch.opened();
    for (const name of ["state", "execution_plan", "plan", "task", "status", "execution", "action", "report", "evidence", "node"]) {
      stream.addEventListener(name, onEvent);
    }
    stream.addEventListener("keepalive", onKeepalive);
    stream.onmessage = onEvent;
    stream.onopen = () => { if (stream === s.stream) heard(); };
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
      watch.stop();
      if (s.probe) s.probe.abort();
      if (s.stream) s.stream.close();
      if (s.graph && s.graph.dispose) s.graph.dispose();
    },
  };
  return handle;
}
