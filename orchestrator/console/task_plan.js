/* A task's plan on its page: the revision shown (kept in the address), the graph, and the
 * selected node's details, with the form that closes a human step. */
import { byField, can, cannot, remember } from "./account.js";
import { api, errorText, missingRoute, sendOnce, stillSending } from "./api.js";
import { countsOf, olderParts, planGraph, retriesIn } from "./graph.js";
import { citation } from "./records.js";
import { badge, el, fill } from "./text.js";
import { FINAL_STATUSES, facts, nodesOf, restoreTyped, typedIn } from "./widgets.js";

const OPEN = ["running", "waiting", "pending"]; // node statuses a finished task leaves as they were

const NODE_DONE = ["completed", "failed", "skipped", "cancelled"];
const STEP_TEXT_MAX = 1500; // a human step's evidence or reason, as the API takes it

// The Plan section of the task page `page` ({taskId, path, s, here, planBox, nodeDetail,
// refresh, loadCited}, task.js): `s.plan` is the live plan, `s.viewing` an older revision.
export function taskPlan(page) {
  const { taskId, path, s, here, planBox, nodeDetail, refresh, loadCited } = page;
  // The revision and the node shown, in the address (replaced: no history entry, no
  // hashchange), so that a reload shows them again.
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
    const stopped = stoppedNotice(plan);
    fill(planBox, el("h3", { id: "plan-title" }, plan.title || ""),
      earlier ? el("p", { class: "notice", id: "plan-earlier" }, earlier) : null,
      stopped ? el("p", { class: "notice", id: "plan-stopped" }, stopped) : null,
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
  // A finished task's latest plan with nodes still open (running, pending, waiting): drawn as
  // they were, under a cancelled or failed status, they read as work going on.
  function stoppedNotice(plan) {
    if (!s.task || !FINAL_STATUSES.has(s.task.status) || plan !== s.plan) return null;
    const open = {};
    for (const node of nodesOf(plan)) {
      if (OPEN.includes(node.status)) open[node.status] = (open[node.status] || 0) + 1;
    }
    const count = Object.values(open).reduce((a, b) => a + b, 0);
    if (!count) return null;
    const which = OPEN.filter((x) => open[x]).map((x) => `${x} ${open[x]}`).join(", ");
    return `The task is ${s.task.status}: nothing more of this plan runs. ${count} node${count === 1 ? "" : "s"} (${which}) ` +
      `${count === 1 ? "stays" : "stay"} as the last revision left ${count === 1 ? "it" : "them"}.`;
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
    if (!retries.length) {
      // On a task that ended, no retry will come: the page says what was, not what is awaited.
      return s.task && FINAL_STATUSES.has(s.task.status) ? el("span", { class: "muted" }, "none")
        : el("span", { class: "error" }, "no retry yet: the task cannot complete until one is completed");
    }
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
  return { showPlan, drawPlan, earlierNotice, loadEarlierPlan, showNode };
}
