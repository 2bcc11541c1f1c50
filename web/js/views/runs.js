// An agent's run history, from the log (GET /api/agents/{id}/runs): newest first, each run
// with when it started, how long it waited at the provider gate and how long the model took,
// tokens, outcome, the orders it placed, the sub-agent calls it made and the model's answer.
// Older runs a page at a time; the first page is read again when one of the agent's runs
// starts or ends.

import {h, replace, setText} from "../dom.js";
import {age, duration, num, orderText, when, ZONE} from "../format.js";
import {orderLink, runLink} from "./drill.js";

const PAGE = 20;
const REFRESH_MS = 1000;
const RUN_EVENTS = new Set(["RunStarted", "RunCompleted", "RunFailed", "RunAborted", "OrderAccepted", "OrderRejected",
  "ModelCalled", "ToolReturned", "ApprovalRequested"]);
const TOOL_MARK = {returned: "✓", failed: "✗", refused: "⊘", asked: "…"};
const SHORT_ANSWER = 90;

function outcome(run) {
  const by = run.by ? ` by ${run.by}` : "";
  switch (run.outcome) {
    case "running": return h("span", {class: "tag"}, "running…");
    case "trade": return h("span", {class: "run-outcome good"}, "trade");
    case "no_trade": return h("span", {class: "run-outcome"}, "no trade");
    case "failed": return h("span", {class: "run-outcome bad", title: run.detail ?? ""}, `failed: ${run.detail ?? ""}`);
    default: return h("span", {class: "run-outcome bad"}, `aborted (${run.detail}${by})`);
  }
}

function orders(agentId, run) {
  if (!run.orders.length) return h("span", {class: "muted"}, "–");
  return h("ul", {class: "run-orders"}, run.orders.map((o) => h("li", {class: o.status === "rejected" ? "error" : ""},
    `${orderText(o)} `, o.status === "rejected" ? `rejected: ${o.reason}`
      : [`${o.status} (`, orderLink(agentId, o.orderId), ")"])));
}

/** A tool loop's steps: each model call with the tools it asked for and how each ended. */
function steps(run) {
  if (!run.steps?.length) return null;
  const n = run.steps.length;
  return h("details", {class: "run-steps", "data-steps": n},
    h("summary", {}, `${n} step${n === 1 ? "" : "s"}`),
    h("ol", {}, run.steps.map((s) => h("li", {"data-step": s.step},
      s.tools.length
        ? s.tools.map((t, i) => h("span", {class: `tool ${t.status}`, title: t.detail ?? "", "data-tool": t.name},
          `${i ? ", " : ""}${t.name} ${TOOL_MARK[t.status] ?? ""}`))
        : h("span", {class: "muted"}, "answered"),
      h("span", {class: "muted"}, ` · ${num(s.tokens)} tokens${s.steered ? ` · saw ${s.steered} steer${s.steered === 1 ? "" : "s"}` : ""}`)))));
}

function answer(run) {
  const text = run.answer || "";
  if (!text) return h("span", {class: "muted"}, "–");
  if (text.length <= SHORT_ANSWER) return h("span", {class: "run-answer"}, text);
  return h("details", {class: "run-answer"}, h("summary", {}, `${text.slice(0, SHORT_ANSWER)}…`), h("p", {}, text));
}

function gateCells(run) {
  const gate = run.gate;
  if (!gate) {
    return [h("td", {"data-col": "wait", class: "num muted"}, "no gate"),
      h("td", {"data-col": "model", class: "num"}, duration(run.durationMs))];
  }
  const partial = gate.complete ? "" : " (part of the gate's log read)";
  const refused = gate.refused ? ` · ${gate.refused} refused` : "";
  return [
    h("td", {"data-col": "wait", class: `num${gate.waitMs >= 1000 ? " warn" : ""}`,
      title: `${gate.calls} model call${gate.calls === 1 ? "" : "s"} through the gate${refused}${partial}`}, duration(gate.waitMs)),
    h("td", {"data-col": "model", class: "num"}, gate.calls ? duration(gate.modelMs) : "–",
      split(gate.waitMs, gate.modelMs)),
  ];
}

/** A bar: the share of waiting at the gate (warn) and of the model's time (accent). */
function split(wait, model) {
  const total = wait + model;
  if (!total) return null;
  const share = Math.round((100 * wait) / total);
  return h("span", {class: "run-split", "aria-hidden": "true", title: `${share}% waiting at the gate`},
    h("span", {class: "wait", style: `width: ${share}%`}), h("span", {class: "model", style: `width: ${100 - share}%`}));
}

/** The run history card of one agent; `seen(events)` reads the newest page again if a run changed. */
export function createRunHistory(ctx, agentId) {
  const status = h("p", {class: "muted", id: "runs-status", role: "status"}, "Loading…");
  const body = h("tbody");
  const table = h("table", {id: "runs-table", class: "runs"},
    h("caption", {class: "sr-only"}, `Runs of ${agentId}, newest first`),
    h("thead", {}, h("tr", {},
      [`Started (${ZONE})`, "Run", "Outcome", "Gate wait", "Model", "Tokens in + out", "Orders", "Calls", "Answer"].map((t, i) =>
        h("th", {scope: "col", class: i >= 3 && i <= 5 ? "num" : null}, t)))),
    body);
  const more = h("button", {type: "button", id: "runs-more", hidden: true}, "Older runs");
  const el = h("section", {class: "card run-history", "aria-labelledby": "runs-title"},
    h("h3", {id: "runs-title"}, "Runs"), status, h("div", {class: "table-scroll"}, table), more);
  let runs = [];
  let before = null;
  let timer = null;
  let loading = false;

  async function loadNewest() {
    timer = null;
    if (loading) return schedule();
    loading = true;
    try {
      const page = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/runs`, {limit: PAGE});
      const fresh = new Set(page.runs.map((r) => r.runId));
      const oldest = page.runs.at(-1)?.version ?? Infinity;
      const kept = runs.filter((r) => !fresh.has(r.runId) && r.version < oldest);
      if (!kept.length) before = page.before;
      runs = [...page.runs, ...kept];
      render();
    } catch (error) {
      setText(status, `Cannot load the runs: ${error.message}`);
    } finally {
      loading = false;
    }
  }

  async function loadOlder() {
    if (before === null) return;
    more.disabled = true;
    try {
      const page = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/runs`, {limit: PAGE, before});
      const known = new Set(runs.map((r) => r.runId));
      runs = [...runs, ...page.runs.filter((r) => !known.has(r.runId))];
      before = page.before;
      render();
    } catch (error) {
      setText(status, `Cannot load older runs: ${error.message}`);
    } finally {
      more.disabled = false;
    }
  }

  function showCalls(runId) {
    const node = document.querySelector(`#call-tree [data-run="${CSS.escape(runId)}"]`);
    if (!node) return;
    node.scrollIntoView({block: "center"});
    node.querySelector("summary")?.focus();
  }

  function render() {
    const now = Date.now();
    const waited = runs.filter((r) => r.gate && r.gate.waitMs >= 1000).length;
    setText(status, runs.length
      ? `${num(runs.length)} run${runs.length === 1 ? "" : "s"} shown, newest first${waited ? ` · ${waited} waited a second or more at the provider gate` : ""}`
      : "No run yet.");
    replace(body, runs.map((run) => h("tr", {"data-run": run.runId, "data-outcome": run.outcome},
      h("td", {"data-col": "started", title: new Date(run.startedAt).toString()},
        when(run.startedAt, now), h("span", {class: "muted"}, ` · ${age(run.startedAt, now)}`)),
      h("td", {"data-col": "run", class: "mono"},
        runLink(agentId, run.runId), " ",
        h("a", {href: `#/agent/${encodeURIComponent(agentId)}?at=${run.position}`, title: "Time travel to this run's start",
          "aria-label": `Time travel to the start of ${run.runId}`, class: "small-link"}, "⏱"),
        run.requests.length > 1 ? h("span", {class: "muted"}, ` (${run.requests.length} requests)`) : null,
        run.steers ? h("span", {class: "muted"}, ` · ${run.steers} steered`) : null,
        steps(run)),
      h("td", {"data-col": "outcome"}, outcome(run)),
      gateCells(run),
      h("td", {"data-col": "tokens", class: "num"}, `${num(run.usage.inputTokens)} + ${num(run.usage.outputTokens)}`),
      h("td", {"data-col": "orders"}, orders(agentId, run)),
      h("td", {"data-col": "calls"}, run.calls
        ? h("button", {type: "button", class: "small", onclick: () => showCalls(run.runId),
          title: "Show this run's calls in the call tree"}, `${run.calls} call${run.calls === 1 ? "" : "s"}`)
        : h("span", {class: "muted"}, "–")),
      h("td", {"data-col": "answer"}, answer(run)))));
    more.hidden = before === null;
  }

  function schedule() {
    if (timer === null) timer = setTimeout(loadNewest, REFRESH_MS);
  }

  more.addEventListener("click", loadOlder);
  loadNewest();
  return {
    el,
    seen(events) {
      if (events.some((e) => e.stream === agentId && RUN_EVENTS.has(e.type))) schedule();
    },
  };
}
