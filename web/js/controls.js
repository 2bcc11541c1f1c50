// Controls by role: each action goes over the public HTTP API and shows its ack or error.
// Only control and admin tokens get these buttons at all (a viewer sees none).

import {h} from "./dom.js";

export const ACTIONS = {
  emergency_stop: {label: "Emergency stop", confirm: "Halt the agent now: its active run is aborted, open orders are cancelled and no run starts until resume.", danger: true},
  pause: {label: "Pause", confirm: null},
  resume: {label: "Resume", confirm: null},
  cancel_all: {label: "Cancel all orders", confirm: "Cancel every open order of the agent."},
  clear_queue: {label: "Clear queue", confirm: "Drop every pending request of the agent (each drop is recorded).", path: "queue/clear"},
  release: {label: "Release", confirm: "Force the lane idle: the active run is aborted (reason release).", path: "release"},
};

/** Ask before a consequential action; resolves true only on an explicit confirm (Esc cancels). */
export function confirmDialog(title, text, ok) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = ok;
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

export class Controls {
  constructor({api, toast}) {
    this.api = api;
    this.toast = toast;
  }

  /** Perform an action on an agent (after a confirm where it needs one); report the answer. */
  async run(agentId, action, report = null) {
    const spec = ACTIONS[action];
    if (spec.confirm && !await confirmDialog(`${spec.label}: ${agentId}?`, spec.confirm, spec.label)) {
      return null;
    }
    const result = await this.perform(agentId, action);
    if (report) report(result);
    this.toast(result.text, result.ok);
    return result;
  }

  /** The HTTP call of an action, as {ok, text}; never throws. */
  async perform(agentId, action) {
    const spec = ACTIONS[action];
    const agent = encodeURIComponent(agentId);
    try {
      if (spec.path) {
        const answer = await this.api.post(`/api/agents/${agent}/${spec.path}`);
        const detail = answer.detail || answer.events.join(", ");
        return {ok: true, text: `${spec.label} ${agentId}: applied${detail ? ` — ${detail}` : ""}`};
      }
      const ack = await this.api.post(`/api/agents/${agent}/control`, {action, reason: "panel"});
      const ok = ack.decision === "accepted";
      return {ok, ack, text: `${spec.label} ${agentId}: ${ack.decision}${ack.reason ? ` — ${ack.reason}` : ""}` +
        ` (position ${ack.position}${ack.repeated ? ", repeated" : ""})`};
    } catch (error) {
      return {ok: false, text: `${spec.label} ${agentId} failed: ${error.message} (${error.code})`};
    }
  }

  /** Emergency stop of every agent in scope, after one confirm. */
  async stopAll(agentIds) {
    const spec = ACTIONS.emergency_stop;
    const ok = await confirmDialog(`Emergency stop all ${agentIds.length} agents?`, spec.confirm, "Stop all");
    if (!ok) return null;
    const results = await Promise.all(agentIds.map((id) => this.perform(id, "emergency_stop")));
    const failed = results.filter((r) => !r.ok);
    const text = failed.length ? `Emergency stop: ${failed.length} of ${results.length} failed — ${failed[0].text}`
      : `Emergency stop: all ${results.length} agents accepted`;
    this.toast(text, !failed.length);
    return results;
  }

  /** A button for an action on an agent; `report` gets the result. */
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
