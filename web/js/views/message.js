// A message to the agent from the panel (control and admin tokens): a `user_control` request
// with `payload.message`, sent with `POST /api/agents/{id}/requests`, as the agent's mode says
// or, while it is busy, steered into its run, queued after it, or interrupting it (`ifBusy`).
// Says "pending…", then what the gateway decided of it (the decisions after the ack's
// position: steered into a run, queued, a run started with it, dropped...).

import {h} from "../dom.js";

const CHOICES = [
  ["", "as its mode says"],
  ["steer", "steer it into the run in flight"],
  ["queue", "queue it after that run"],
  ["interrupt", "interrupt that run (high priority)"],
];

function requestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(10));
  return `msg_${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** What the gateway made of the message, from the decisions of its input. */
function decided(agentId, ack, cause) {
  if (ack.decision !== "accepted") {
    return {ok: false, kind: "bad", text: `Message to ${agentId}: ${ack.decision}${ack.reason ? ` — ${ack.reason}` : ""}`};
  }
  const said = [];
  for (const d of cause?.decisions ?? []) {
    const data = d.data;
    if (d.type === "RunSteered") said.push(`steered into ${data.run_id}`);
    else if (d.type === "RunStarted") said.push(`run ${data.run_id} started with it`);
    else if (d.type === "RequestQueued") said.push(`queued (${data.mode})`);
    else if (d.type === "RunAborted") said.push(`run ${data.run_id} interrupted`);
    else if (d.type === "FallbackApplied") said.push(`fallback: ${data.reason}`);
    else if (d.type === "RequestDropped" && data.request_id === ack.requestId) said.push(`dropped: ${data.reason}`);
    else if (d.type === "RunsSuppressed") said.push(`runs wait: ${data.detail}`);
  }
  return {ok: true, kind: "ok", text: `Message to ${agentId}: ${said.join(", ") || "accepted"} (log position ${ack.position})`};
}

/** The message box of an agent's page (null for a token that may not send). */
export function createMessageBox(ctx, agentId) {
  if (!ctx.controls) return null;
  const text = h("textarea", {id: "message-text", rows: 2, maxlength: 4000, required: true,
    placeholder: "e.g. Reduce BTC exposure before the close"});
  const mode = h("select", {id: "message-mode"}, CHOICES.map(([value, label]) => h("option", {value}, label)));
  const send = h("button", {type: "submit", id: "message-send", "data-mutating": true}, "Send");
  const result = h("p", {class: "result", id: "message-result", role: "status"});
  const form = h("form", {class: "message-box", id: "message-box", "aria-label": `Message to ${agentId}`},
    h("label", {for: "message-text"}, `Message to ${agentId}`), text,
    h("div", {class: "toolbar"}, h("label", {for: "message-mode"}, "While it is busy:"), mode, send), result);

  function report(answer) {
    result.textContent = answer.text;
    result.className = `result ${answer.kind ?? (answer.ok ? "ok" : "bad")}`;
  }

  async function deliver(body) {
    try {
      const ack = await ctx.api.post(`/api/agents/${encodeURIComponent(agentId)}/requests`, body);
      let cause = null;
      try {
        cause = await ctx.api.get(`/api/events/${ack.position}`);
      } catch {
        // the ack stands; what came of it shows in the story
      }
      return decided(agentId, ack, cause);
    } catch (error) {
      return {ok: false, kind: "bad", text: `Message to ${agentId} failed: ${error.message} (${error.code}); nothing was sent`};
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = text.value.trim();
    if (!message || send.getAttribute("aria-busy") === "true") return;
    const ifBusy = mode.value || undefined;
    const body = {requestId: requestId(), createdAt: new Date().toISOString(), agentId, kind: "user_control",
      priority: ifBusy === "interrupt" ? "high" : "normal", payload: {message}, ...(ifBusy ? {ifBusy} : {})};
    send.setAttribute("aria-busy", "true");
    try {
      const answer = await ctx.controls.track(`Message to ${agentId}`, deliver(body), report);
      if (answer.ok) text.value = "";
    } finally {
      send.removeAttribute("aria-busy");
    }
  });
  return form;
}
