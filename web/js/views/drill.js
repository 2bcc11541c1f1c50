// Drill-down on the agent page (#/agent/ID?order=ORDER or ?run=RUN): an order's life from
// the log (GET /api/agents/{id}/orders/{orderId}: placed, approval, each broker report,
// fills, cancels, how it closed, each with the input that caused it) with the run that
// decided it; a run in full (GET /api/agents/{id}/runs/{runId}: the requests it started with
// as the model read them, each model call's text and tool calls with their results, the
// steers it took, its answer and orders). Every position links to time travel.

import {h, replace} from "../dom.js";
import {duration, num, orderText, when} from "../format.js";

const json = (value) => JSON.stringify(value, null, 2);

function travel(agentId, position, text = `@${position}`) {
  return h("a", {href: `#/agent/${encodeURIComponent(agentId)}?at=${position}`, class: "mono",
    title: "Time travel to this position"}, text);
}

/** A link to an order's drill-down. */
export function orderLink(agentId, orderId, text = orderId) {
  return h("a", {href: `#/agent/${encodeURIComponent(agentId)}?order=${encodeURIComponent(orderId)}`,
    class: "mono", "data-order-link": orderId, title: `The life of order ${orderId}`}, text);
}

/** A link to a run's drill-down. */
export function runLink(agentId, runId, text = runId) {
  return h("a", {href: `#/agent/${encodeURIComponent(agentId)}?run=${encodeURIComponent(runId)}`,
    class: "mono", "data-run-link": runId, title: `Run ${runId} in full`}, text);
}

function request(agentId, r, label) {
  if (r.missing) return h("li", {"data-request": r.requestId}, h("span", {class: "mono"}, r.requestId), " ",
    h("span", {class: "muted"}, "(its input is further back than this read reaches)"));
  const message = r.payload?.message;
  return h("li", {"data-request": r.requestId},
    h("span", {class: "tag"}, label ?? r.kind), " ", h("span", {class: "mono"}, r.requestId),
    h("span", {class: "muted"}, ` · ${r.priority} · ${when(r.at)}${r.principal ? ` · by ${r.principal}` : ""}`
      + `${r.source ? ` · from ${r.source}` : ""} · `), travel(agentId, r.position),
    message ? h("blockquote", {class: "said-message"}, message) : h("pre", {class: "payload"}, json(r.payload)));
}

function toolCall(c) {
  return h("li", {class: `tool ${c.status}`, "data-tool": c.name, "data-call": c.callId},
    h("strong", {}, c.name), " ", h("span", {class: `tag ${c.status === "returned" ? "good" : c.status === "asked" ? "" : "bad"}`}, c.status),
    h("span", {class: "muted mono"}, ` ${c.callId}`),
    h("details", {}, h("summary", {}, "arguments"), h("pre", {}, c.malformed ?? json(c.arguments))),
    c.result !== null ? h("details", {open: true}, h("summary", {}, c.status === "returned" ? "result" : "error"),
      h("pre", {class: "tool-result"}, c.result)) : null);
}

function step(agentId, s) {
  return h("li", {class: "step", "data-step": s.step},
    h("p", {}, h("strong", {}, `Step ${s.step}`),
      h("span", {class: "muted"}, ` · model call at ${when(s.at)} · ${num(s.inputTokens)} + ${num(s.outputTokens)} tokens`
        + `${s.stopReason ? ` · stopped: ${s.stopReason}` : ""}${s.steered.length ? ` · saw steers ${s.steered.join(", ")}` : ""} · `),
      travel(agentId, s.position)),
    s.text ? h("pre", {class: "model-text"}, s.text) : null,
    s.toolCalls.length ? h("ul", {class: "tool-calls"}, s.toolCalls.map(toolCall))
      : h("p", {class: "muted"}, "No tool call: its answer follows."));
}

function outcomeText(run) {
  if (run.outcome === "running") return "running…";
  return `${run.outcome.replace("_", " ")}${run.detail ? ` (${run.detail})` : ""}`;
}

/** A run in full (an answer of GET /api/agents/{id}/runs/{runId}). */
export function runSection(run) {
  const agentId = run.agentId;
  const prompt = run.prompt;
  return h("section", {class: "drill-run", id: "drill-run", "data-run": run.runId, "aria-labelledby": "drill-run-title"},
    h("h4", {id: "drill-run-title"}, "Run ", runLink(agentId, run.runId), " ",
      h("span", {class: `run-outcome ${run.outcome === "trade" ? "good" : run.outcome === "failed" || run.outcome === "aborted" ? "bad" : ""}`}, outcomeText(run))),
    h("dl", {class: "facts"},
      h("dt", {}, "Started"), h("dd", {}, when(run.startedAt), " ", travel(agentId, run.position)),
      h("dt", {}, "Ended"), h("dd", {}, run.endedAt ? `${when(run.endedAt)} (${duration(run.endedAt - run.startedAt)})` : "not yet"),
      h("dt", {}, "Tokens"), h("dd", {}, `${num(run.usage.inputTokens)} in + ${num(run.usage.outputTokens)} out`)),
    h("h5", {}, `Prompt: the requests it started with (${prompt.requests.length})`),
    prompt.summary ? h("p", {class: "muted"}, `and a summary of ${prompt.summary.count} requests the queue cap folded away`) : null,
    h("ul", {class: "list drill-prompt", id: "drill-prompt"}, prompt.requests.map((r) => request(agentId, r))),
    h("details", {}, h("summary", {}, "As the model read them"), h("pre", {id: "drill-prompt-text"}, prompt.text)),
    h("h5", {}, `Messages and tool steps (${run.steps.length ? `${run.steps.length} model call${run.steps.length === 1 ? "" : "s"}` : "not recorded"})`),
    run.steps.length ? h("ol", {class: "drill-steps", id: "drill-steps"}, run.steps.map((s) => step(agentId, s)))
      : h("p", {class: "muted", id: "drill-steps"}, "One model call, no tool step recorded."),
    h("h5", {}, `Steers it took (${run.steers.length})`),
    run.steers.length ? h("ul", {class: "list", id: "drill-steers"}, run.steers.map((r) => request(agentId, r, "steer")))
      : h("p", {class: "muted", id: "drill-steers"}, "None."),
    h("h5", {}, "Answer"),
    run.answer ? h("pre", {class: "model-text", id: "drill-answer"}, run.answer) : h("p", {class: "muted", id: "drill-answer"}, "No answer text."),
    h("h5", {}, `Orders (${run.orders.length})`),
    run.orders.length ? h("ul", {class: "list", id: "drill-orders"}, run.orders.map((o) => h("li", {},
      orderText(o.intent), " · ", o.orderId ? orderLink(agentId, o.orderId) : null, " ",
      h("span", {class: o.status === "rejected" ? "error" : "muted"}, o.status === "rejected" ? `refused: ${o.reason}` : o.status))))
      : h("p", {class: "muted", id: "drill-orders"}, "None."));
}

/** An order's life (an answer of GET /api/agents/{id}/orders/{orderId}). */
export function orderSection(life) {
  const agentId = life.agentId;
  return h("section", {class: "drill-order", id: "drill-order", "data-order": life.orderId},
    h("p", {}, life.intent ? h("strong", {}, orderText(life.intent)) : null, " · ",
      h("span", {class: `tag ${life.status === "filled" ? "good" : life.status === "open" ? "warn" : ""}`, id: "drill-order-status"}, life.status),
      life.flattenBy ? [" · ", h("span", {class: "tag warn flatten", id: "drill-order-flatten"}, "operator flatten"), ` by request ${life.flattenBy}`]
        : [" · decided by run ", runLink(agentId, life.runId)]),
    h("ol", {class: "life", id: "drill-life", "aria-label": `The life of order ${life.orderId}`},
      life.steps.map((s) => h("li", {"data-stage": s.stage, "data-type": s.type},
        h("span", {class: "life-at"}, when(s.at)), " ", h("strong", {class: "life-stage"}, s.stage), " ",
        travel(agentId, s.position), h("div", {class: "muted"}, s.text),
        s.cause ? h("div", {class: "muted small"}, "caused by ", travel(agentId, s.cause.position, `${s.cause.type} @${s.cause.position}`),
          `: ${s.cause.text}`) : null))));
}

/** The drill-down card of one agent's page: `order(id)`, `run(id)`, `close()`. */
export function createDrill(ctx, agentId) {
  const title = h("h3", {id: "drill-title"});
  const body = h("div", {id: "drill-body", "aria-live": "polite"});
  const close = h("a", {href: `#/agent/${encodeURIComponent(agentId)}`, class: "small-link", id: "drill-close"}, "Close");
  const el = h("section", {class: "card drill", id: "drill", hidden: true, tabindex: -1, "aria-labelledby": "drill-title"},
    h("div", {class: "drill-head"}, title, close), body);
  const path = `/api/agents/${encodeURIComponent(agentId)}`;
  let seq = 0;

  async function open(heading, load) {
    const mine = ++seq;
    el.hidden = false;
    replace(title, heading);
    replace(body, h("p", {class: "muted"}, "Reading the log…"));
    el.scrollIntoView({block: "start"});
    try {
      const parts = await load();
      if (mine === seq) replace(body, parts);
    } catch (error) {
      if (mine === seq) replace(body, h("p", {class: "error"}, error.message));
    }
  }

  return {
    el,
    order(orderId) {
      return open(`Order ${orderId}`, async () => {
        const life = await ctx.api.get(`${path}/orders/${encodeURIComponent(orderId)}`);
        let run = null;
        try {
          run = runSection(await ctx.api.get(`${path}/runs/${encodeURIComponent(life.runId)}`));
        } catch (error) {
          run = h("p", {class: "error"}, `Run ${life.runId}: ${error.message}`);
        }
        return [orderSection(life), run];
      });
    },
    run(runId) {
      return open(`Run ${runId}`, async () => [runSection(await ctx.api.get(`${path}/runs/${encodeURIComponent(runId)}`))]);
    },
    close() {
      seq += 1;
      el.hidden = true;
    },
  };
}
