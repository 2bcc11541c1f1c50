// Controls by role: each action goes over the public HTTP API and shows its ack or error.
// Only control and admin tokens get these buttons at all (a viewer sees none).
//
// Every action says "pending…" at once, then what its ack says it did (the ack's `effect`:
// "alpha ACTIVE → HALTED: run alpha-r7 aborted", or "alpha was already ACTIVE: nothing
// changed"), or, with no answer within OUTCOME_TIMEOUT_MS, that its outcome is unknown (and
// the answer if it comes later).

import {h} from "./dom.js";

export const OUTCOME_TIMEOUT_MS = 5_000;
const UNKNOWN = Symbol("unknown");

export const ACTIONS = {
  emergency_stop: {label: "Emergency stop", confirm: "Halt the agent now: its active run is aborted, open orders are cancelled and no run starts until resume.", danger: true},
  pause: {label: "Pause", confirm: null},
  resume: {label: "Resume", confirm: null},
  cancel_all: {label: "Cancel all orders", confirm: "Cancel every open order of the agent."},
  clear_queue: {label: "Clear queue", confirm: "Drop every pending request of the agent (each drop is recorded).", path: "queue/clear"},
  release: {label: "Release", confirm: "Force the lane idle: the active run is aborted (reason release).", path: "release"},
};

/**
 * Ask before a consequential action; resolves true only on an explicit confirm (Esc
 * cancels). `items`: names listed under the text (the agents a stop of all halts).
 * `option`: the label of a checkbox shown unticked under them (read it with
 * `confirmOption()` once confirmed); none when null.
 */
export function confirmDialog(title, text, ok, items = null, keep = "Cancel", option = null) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const list = document.getElementById("confirm-list");
  list.replaceChildren(...(items || []).map((item) => h("li", {}, item)));
  list.hidden = !items;
  document.getElementById("confirm-option").hidden = !option;
  document.getElementById("confirm-option-text").textContent = option || "";
  document.getElementById("confirm-option-box").checked = false;
  document.getElementById("confirm-ok").textContent = ok;
  document.getElementById("confirm-cancel").textContent = keep;  // (never "Cancel" beside "Cancel order")
  dialog.returnValue = "";
  const opener = document.activeElement;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (opener?.isConnected) opener.focus();  // back where the person was
      resolve(dialog.returnValue === "confirm");
    }, {once: true});
    dialog.showModal();
    document.getElementById("confirm-ok").focus();
  });
}

/** Whether the last confirm's checkbox (its `option`) was ticked. */
export function confirmOption() {
  const box = document.getElementById("confirm-option-box");
  return !document.getElementById("confirm-option").hidden && box.checked;
}

/** What an ack says an action did, in words a person reads at a glance. */
export function consequence(agentId, action, ack) {
  const spec = ACTIONS[action];
  if (ack.decision !== "accepted") {
    return {ok: false, kind: "bad", text: `${spec.label} ${agentId}: ${ack.decision}${ack.reason ? ` — ${ack.reason}` : ""}`};
  }
  const effect = ack.effect;
  if (ack.repeated || !effect) {
    return {ok: true, kind: "ok", text: `${spec.label} ${agentId}: accepted${ack.repeated ? " (a repeat: it was accepted before)" : ""}`};
  }
  if (!effect.changed) {
    const text = action === "cancel_all" || action === "cancel_order"
      ? `${spec.label} ${agentId}: no open order to cancel — nothing changed`
      : `${agentId} was already ${effect.toState}: nothing changed`;
    return {ok: true, kind: "info", effect, text};
  }
  const done = [];
  if (effect.abortedRun) done.push(`run ${effect.abortedRun} aborted`);
  if (effect.cancelsRequested) done.push(`cancel sent for ${plural(effect.cancelsRequested, "open order")}`);
  if (effect.callsCancelled) done.push(`${plural(effect.callsCancelled, "sub-agent call")} cancelled`);
  if (effect.unheld) done.push("provider hold lifted");
  if (effect.startedRun) done.push(`run ${effect.startedRun} started`);
  const states = effect.fromState === effect.toState ? `${spec.label} ${agentId} (still ${effect.toState})`
    : `${agentId} ${effect.fromState} → ${effect.toState}`;
  return {ok: true, kind: "ok", effect, text: done.length ? `${states}: ${done.join(", ")}` : states};
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** `promise`, or UNKNOWN if it has not settled within `ms`. */
function within(promise, ms) {
  let timer;
  const late = new Promise((resolve) => { timer = setTimeout(() => resolve(UNKNOWN), ms); });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

export class Controls {
  /** `toasts`: a `Toasts`; `model`: the live model (what state an agent is in now). */
  constructor({api, toasts, model = null}) {
    this.api = api;
    this.toasts = toasts;
    this.model = model;
  }

  /** Perform an action on an agent (after a confirm where it needs one); report the answer. */
  async run(agentId, action, report = null) {
    const spec = ACTIONS[action];
    const now = this.model?.agents.get(agentId)?.trading;
    if (spec.confirm && !await confirmDialog(`${spec.label}: ${agentId}?`,
      `${now ? `${agentId} is ${now} now. ` : ""}${spec.confirm}`, spec.label)) {
      return null;
    }
    return this.track(`${spec.label} ${agentId}`, this.perform(agentId, action), report);
  }

  /**
   * Say "pending…" for `promise` (a `perform`) at once, then its result, or after
   * OUTCOME_TIMEOUT_MS that its outcome is unknown (and its answer if it comes later).
   */
  async track(what, promise, report = null, check = "the agent's state") {
    const pending = {ok: true, kind: "pending", text: `${what}: pending…`};
    const note = this.toasts.show(pending.text, "pending");
    if (report) report(pending);
    const first = await within(promise, OUTCOME_TIMEOUT_MS);
    if (first !== UNKNOWN) {
      note.update(first.text, first.kind);
      if (report) report(first);
      return first;
    }
    const unknown = {ok: false, kind: "bad", unknown: true,
      text: `${what}: outcome unknown — check ${check} (no answer in ${OUTCOME_TIMEOUT_MS / 1000} s)`};
    note.update(unknown.text, "bad");
    if (report) report(unknown);
    promise.then((result) => {
      const late = {...result, text: `${result.text} (answered late)`};
      note.update(late.text, late.kind);
      if (report) report(late);
    });
    return unknown;
  }

  /** The HTTP call of an action, as {ok, kind, text}; never throws. */
  async perform(agentId, action) {
    const spec = ACTIONS[action];
    const agent = encodeURIComponent(agentId);
    try {
      if (spec.path) {
        const answer = await this.api.post(`/api/agents/${agent}/${spec.path}`);
        const detail = answer.detail || answer.events.join(", ");
        return {ok: true, kind: "ok", text: `${spec.label} ${agentId}: applied${detail ? ` — ${detail}` : ""}`};
      }
      const ack = await this.api.post(`/api/agents/${agent}/control`, {action, reason: "panel"});
      return {...consequence(agentId, action, ack), ack};
    } catch (error) {
      return {ok: false, kind: "bad", text: `${spec.label} ${agentId} failed: ${error.message} (${error.code})`};
    }
  }

  /**
   * Emergency stop of every agent in the token's scope: one desk kill on the server
   * (`POST /api/desk/kill`, one recorded operator command), after a confirm that names the
   * agents it halts (the server's list; `known`, the page's, if that cannot be read). A
   * summary of what it did, and each agent's result in a dialog.
   */
  async stopAll(known) {
    let agentIds = known;
    let note = "";
    try {
      agentIds = (await this.api.get("/api/desk/kill")).agents;
    } catch (error) {
      note = ` (The gateway's list could not be read: ${error.message}. These are the agents this page knows; the stop reaches every agent of your token's scope.)`;
    }
    const ok = await confirmDialog(`Emergency stop all ${plural(agentIds.length, "agent")}?`,
      `Halts each agent listed below now: its active run is aborted, its open orders are cancelled and no run starts until resume.${note}`,
      "Stop all", agentIds, "Cancel", "also flatten positions (then one closing market order per symbol each agent holds)");
    if (!ok) return null;
    const flatten = confirmOption();
    const killed = this.api.post("/api/desk/kill", flatten ? {reason: "panel", flatten: true} : {reason: "panel"})
      .then((answer) => this.showKill(answer))
      .catch((error) => ({ok: false, kind: "bad", text: `Emergency stop all failed: ${error.message} (${error.code})`}));
    return this.track(`Emergency stop of ${plural(agentIds.length, "agent")}`, killed, null, "their states");
  }

  /** A desk kill's answer: its summary, and each agent's result listed in a dialog. */
  showKill(answer) {
    const results = answer.kill.agents.map((agent) => agent.error
      ? {ok: false, kind: "bad", id: agent.agentId, text: `${agent.agentId}: not halted — ${agent.message || agent.error} (${agent.error})`}
      : {...consequence(agent.agentId, "emergency_stop", agent), id: agent.agentId});
    answer.kill.agents.forEach((agent, i) => {  // (with a flatten: what it sent for each)
      if (agent.flattenOrders?.length) {
        results[i].text += `; flatten: ${agent.flattenOrders.map((o) => `${o.side} ${o.qty} ${o.symbol}`).join(", ")}`;
      } else if (agent.flattenNote) {
        results[i].text += `; flatten: ${agent.flattenNote}`;
      }
    });
    const summary = summarizeStops(results);
    const flattened = answer.kill.flatten ? `, ${plural(answer.flattenOrders ?? 0, "flatten order")}` : "";
    document.getElementById("kill-results-summary").textContent =
      `${summary.text}; ${plural(answer.cancelsRequested, "order cancel")}${flattened} sent. Recorded as ${answer.kill.killId}.`;
    document.getElementById("kill-results-list").replaceChildren(...results.map((r) =>
      h("li", {class: r.ok ? null : "bad", "data-agent": r.id}, r.text)));
    const dialog = document.getElementById("kill-results");
    if (!dialog.open) dialog.showModal();
    return summary;
  }

  /** A button for an action on an agent; `report` gets each result (pending first). */
  button(agentId, action, report, {small = false, label = null} = {}) {
    const spec = ACTIONS[action];
    const cls = [spec.danger ? "danger" : "", small ? "small" : ""].join(" ").trim() || null;
    const button = h("button", {
      type: "button", class: cls, "data-mutating": true, "data-action": action,
      "aria-label": `${spec.label} ${agentId}`, text: label || spec.label,
    });
    button.addEventListener("click", async () => {
      // Busy, not disabled: a disabled button would lose the focus the dialog gives back.
      if (button.getAttribute("aria-busy") === "true") return;
      button.setAttribute("aria-busy", "true");
      try { await this.run(agentId, action, report); } finally { button.removeAttribute("aria-busy"); }
    });
    return button;
  }
}

/** One line for the acks of an emergency stop of many agents. */
function summarizeStops(results) {
  const failed = results.filter((r) => !r.ok);
  const halted = results.filter((r) => r.ok && r.effect?.changed);
  const already = results.filter((r) => r.ok && r.effect && !r.effect.changed);
  const aborted = halted.filter((r) => r.effect.abortedRun).length;
  const parts = [];
  if (halted.length) parts.push(`${plural(halted.length, "agent")} halted${aborted ? ` (${plural(aborted, "run")} aborted)` : ""}`);
  if (already.length) parts.push(`${already.length} already HALTED`);
  if (failed.length) parts.push(`${failed.length} failed — ${failed[0].text}`);
  return {ok: !failed.length, kind: failed.length ? "bad" : "ok", results,
    text: `Emergency stop: ${parts.join(", ") || "no agent"}`};
}
