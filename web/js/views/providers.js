// Provider gate: each provider's limits, usage in the current windows, waiting agents,
// breaker state and next retry, live.

import {h, keepingFocus, replace} from "../dom.js";
import {clock, duration, num} from "../format.js";
import {Model} from "../model.js";

function meter(label, value, limit) {
  const text = limit ? `${num(value)} / ${num(limit)}` : `${num(value)} (no limit)`;
  return h("div", {class: "meter"},
    h("span", {}, label),
    limit ? h("meter", {min: 0, max: limit, value, low: limit * 0.7, high: limit * 0.9, optimum: 0, "aria-label": `${label}: ${text}`})
      : h("span", {class: "muted"}, "–"),
    h("span", {class: "num"}, text));
}

function countdown(until, now) {
  return until && until > now ? `in ${duration(until - now)} (${clock(until)})` : "–";
}

function card(p, model) {
  const now = model.serverNow();
  const l = p.limits;
  const breaker = p.breaker === "closed" ? "tag good" : p.breaker === "open" ? "tag bad" : "tag warn";
  return h("article", {class: "card", "aria-labelledby": `provider-${p.name}`, "data-provider": p.name},
    h("h3", {id: `provider-${p.name}`}, p.name, " ", h("span", {class: breaker}, `breaker ${p.breaker.replace("_", "-")}`)),
    h("dl", {class: "facts"},
      h("dt", {}, "Breaker until"), h("dd", {}, countdown(p.breakerUntil, now)),
      h("dt", {}, "Next retry"), h("dd", {}, countdown(p.nextRetry, now)),
      h("dt", {}, "Backoff attempt"), h("dd", {}, String(p.backoffAttempt)),
      h("dt", {}, "Probe in flight"), h("dd", {}, p.probeInFlight ? "yes" : "no"),
      h("dt", {}, "Provider says"), h("dd", {}, p.remainingRequests === null && p.remainingTokens === null ? "–"
        : `${num(p.remainingRequests)} requests, ${num(p.remainingTokens)} tokens left${p.providerResetAt ? ` until ${clock(p.providerResetAt)}` : ""}`)),
    h("h4", {}, "Usage in the current 60 s windows"),
    meter("Requests", p.windowRequests, l.requestsPerMinute),
    meter("Input tokens", p.windowInputTokens, l.inputTokensPerMinute),
    meter("Output tokens", p.windowOutputTokens, l.outputTokensPerMinute),
    meter("Calls in flight", p.inFlight, l.maxConcurrent),
    h("h4", {}, `Waiting (${p.waiting})`),
    p.waitingAgents.length ? h("table", {class: "plain", "aria-label": `Agents waiting at ${p.name}`},
      h("thead", {}, h("tr", {}, ["Agent", "Waiting", "Oldest wait", "Tokens"].map((c) => h("th", {scope: "col"}, c)))),
      h("tbody", {}, p.waitingAgents.map((w) => h("tr", {},
        h("td", {}, h("a", {href: `#/agent/${encodeURIComponent(w.agentId)}`, "data-focus-key": `${p.name}/${w.agentId}`}, w.agentId)),
        h("td", {class: "num"}, num(w.waiting)),
        h("td", {class: "num"}, duration(w.oldestWaitMs + Model.elapsed(p))),
        h("td", {class: "num"}, num(w.tokens))))))
      : h("p", {class: "muted"}, p.waiting ? "Waiting agents are outside this token's scope." : "Nobody waits."),
    h("h4", {}, "Limits"),
    h("dl", {class: "facts"}, Object.entries(l).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v === null ? "none" : num(v))])),
    h("h4", {}, "Counters"),
    h("dl", {class: "facts"}, Object.entries(p.counters).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, num(v))])));
}

export function createProviders(ctx) {
  const section = document.getElementById("providers-view");
  const grid = h("div", {class: "providers live"});
  const note = h("p", {class: "muted"});
  replace(section, h("h2", {id: "providers-title"}, "Provider gate"), note, grid);
  let ticks = 0;

  function poll() {
    // The windows slide with time alone, so read the gates now and then while shown.
    ctx.model.providersDirty = true;
    ctx.model.scheduleRefresh();
  }

  function render() {
    const list = [...ctx.model.providers.values()];
    note.textContent = list.length
      ? "Every LLM call of every agent takes a slot from its provider's gate, which keeps all agents together inside the provider's limits."
      : "No provider gate is configured.";
    keepingFocus(grid, () => replace(grid, ...list.map((p) => card(p, ctx.model))));
  }

  return {
    section,
    title: "Provider gate",
    show() { poll(); render(); },
    change(detail) { if (detail.providers) render(); },
    tick() {
      if (++ticks % 4 === 0) poll();
      render();
    },
  };
}
