// Sub-agent calls of one agent as a tree: each run that made calls, each call with its target,
// status and answer, and below it the calls its target made while serving it. Read from
// GET /api/agents/{id}/calls (folded from the log), again when call events of the agent arrive.

import {h, replace, setText} from "../dom.js";
import {num} from "../format.js";

const CALL_EVENTS = new Set(["CallBatchOpened", "AgentCallQueued", "AgentCallDispatched",
  "AgentCallRejected", "CallEnded"]);
const REFRESH_MS = 1000;
/** Levels shown open at first: runs, their calls and those calls' calls (deeper: a click). */
const OPEN_DEPTH = 2;
const STATUS_GLYPH = {queued: "…", out: "→", returned: "✓", failed: "✗", refused: "⊘",
  cancelled: "■", timed_out: "⏱"};

/** Whether an event of the log changes an agent's call tree. */
export function isCallEvent(event) {
  return CALL_EVENTS.has(event.type);
}

function usage(u) {
  return u ? `${num(u.inputTokens ?? 0)}+${num(u.outputTokens ?? 0)} tokens` : "";
}

function callNode(call, level) {
  const status = h("span", {class: `call-status ${call.status}`},
    `${STATUS_GLYPH[call.status] ?? ""} ${call.status}`);
  const detail = call.error ?? call.answer ?? "";
  const line = h("span", {class: "call-line"}, status, " ", h("strong", {}, call.target),
    h("span", {class: "muted"}, ` ${call.callId} · ${call.priority}`),
    call.usage ? h("span", {class: "muted"}, ` · ${usage(call.usage)}`) : null,
    detail ? h("span", {class: call.error ? "error" : ""}, ` — ${detail}`) : null);
  const item = h("li", {role: "treeitem", "data-call": call.callId, "data-status": call.status,
    "aria-level": level});
  if (!call.calls.length) {
    item.append(line);
    return item;
  }
  const below = h("ul", {role: "group"}, call.calls.map((c) => callNode(c, level + 1)));
  item.setAttribute("aria-expanded", level <= OPEN_DEPTH ? "true" : "false");
  const details = h("details", {open: level <= OPEN_DEPTH},
    h("summary", {}, line, h("span", {class: "muted"}, ` (${call.calls.length} calls)`)), below);
  details.addEventListener("toggle", () => item.setAttribute("aria-expanded", String(details.open)));
  item.append(details);
  return item;
}

/** The card of an agent's call trees; `refresh()` reads them again (at most once a second). */
export function createCallTree(ctx, agentId) {
  const counts = h("p", {class: "muted", id: "call-counts", role: "status"}, "Loading…");
  const tree = h("ul", {role: "tree", id: "call-tree", "aria-label": `Sub-agent calls of ${agentId}`});
  const el = h("section", {class: "card", "aria-labelledby": "calls-title"},
    h("h3", {id: "calls-title"}, "Sub-agent calls"), counts, tree);
  let timer = null;
  let loading = false;

  async function load() {
    timer = null;
    if (loading) return schedule();
    loading = true;
    try {
      const answer = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/calls`);
      const total = Object.values(answer.counts).reduce((a, b) => a + b, 0);
      const runs = answer.runs.length;
      setText(counts, total ? `${num(total)} calls in ${runs} run${runs === 1 ? "" : "s"}: `
        + Object.entries(answer.counts).map(([s, n]) => `${num(n)} ${s}`).join(" · ")
        : "This agent's runs made no sub-agent call (in the newest 20).");
      replace(tree, answer.runs.map((run) => h("li", {role: "treeitem", "data-run": run.runId,
        "aria-level": 1, "aria-expanded": "true"},
      h("details", {open: true}, h("summary", {}, h("strong", {}, run.runId),
        h("span", {class: "muted"}, ` made ${run.calls.length} calls`)),
      h("ul", {role: "group"}, run.calls.map((c) => callNode(c, 2)))))));
    } catch (error) {
      setText(counts, `Cannot load the calls: ${error.message}`);
    } finally {
      loading = false;
    }
  }

  function schedule() {
    if (timer === null) timer = setTimeout(load, REFRESH_MS);
  }

  load();
  return {el, refresh: schedule};
}
