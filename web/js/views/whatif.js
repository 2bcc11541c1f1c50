// What-if from a moment of time travel: the agent as it was at the picked position, then its
// recorded inputs after it re-run under a config chosen here (POST /api/agents/{id}/whatif,
// the model of `gateway whatif`: docs/debugger.md), and recorded against what-if, measure by
// measure. The form starts from the agent's config now.

import {h, replace, setText} from "../dom.js";
import {clock, num} from "../format.js";

const MODES = ["followup", "queue", "interrupt", "collect", "steer", "steer-backlog"];
const POLICIES = ["old", "new", "summarize"];
/** The settings offered: [label, path in the config, kind]. */
const FIELDS = [
  ["Mode", "mode", MODES], ["Cap", "cap", "int"], ["Drop policy", "dropPolicy", POLICIES],
  ["Debounce (ms)", "debounceMs", "int"], ["Max runs per hour", "budgets.maxRunsPerHour", "limit"],
  ["Max runs per day", "budgets.maxRunsPerDay", "limit"], ["No-trade cooldown (ms)", "budgets.noTradeCooldownMs", "int"],
  ["Run timeout (ms)", "runTimeoutMs", "int"],
];

const get = (config, path) => path.split(".").reduce((v, k) => v?.[k], config);

function set(config, path, value) {
  const keys = path.split(".");
  const last = keys.pop();
  let at = config;
  for (const k of keys) at = at[k] = {...(at[k] ?? {})};
  at[last] = value;
}

/** The what-if part of the time-travel card; `position()` is the picked log position. */
export function createWhatIf(ctx, agentId, {position}) {
  const inputs = new Map();
  const fields = FIELDS.map(([label, path, kind]) => {
    const id = `whatif-${path.replace(".", "-")}`;
    const input = Array.isArray(kind) ? h("select", {id}, kind.map((v) => h("option", {value: v}, v)))
      : h("input", {id, type: "number", min: kind === "limit" ? 1 : 0, step: 1,
        placeholder: kind === "limit" ? "no limit" : null, inputmode: "numeric"});
    inputs.set(path, [input, kind]);
    return h("label", {for: id, class: "whatif-field"}, label, input);
  });
  const run = h("button", {type: "submit", id: "whatif-run"}, "Run what-if from here");
  const status = h("p", {class: "muted", id: "whatif-status", role: "status"});
  const out = h("div", {id: "whatif-result", "aria-live": "polite"});
  const form = h("form", {class: "whatif-form", id: "whatif-form", "aria-label": "What-if from here"},
    h("div", {class: "whatif-fields"}, fields), h("div", {class: "toolbar"}, run));
  const el = h("section", {class: "whatif", id: "whatif", "aria-labelledby": "whatif-title"},
    h("h4", {id: "whatif-title"}, "What-if from here"),
    h("p", {class: "muted"}, "Re-run this agent's recorded inputs after the picked position under other settings, "
      + "from the agent exactly as it was there: each run replays a recorded one (its duration, outcome and tokens); "
      + "orders and sub-agent calls are not simulated. The gateway does it from the log (gateway whatif's model)."),
    form, status, out);
  let base = null;
  let seq = 0;

  async function fill() {
    const agent = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}`);
    base = agent.config;
    for (const [path, [input]] of inputs) {
      const value = get(base, path);
      input.value = value === null || value === undefined ? "" : String(value);
    }
  }

  function chosen() {
    const config = structuredClone(base);
    for (const [path, [input, kind]] of inputs) {
      if (Array.isArray(kind)) set(config, path, input.value);
      else set(config, path, input.value === "" ? (kind === "limit" ? null : get(base, path)) : Number(input.value));
    }
    return config;
  }

  function show(answer) {
    const changes = answer.changes.length
      ? answer.changes.map((c) => `${c.setting} ${c.recorded ?? "none"} → ${c.whatif ?? "none"}`).join("; ")
      : "the same settings as recorded";
    replace(out,
      h("p", {id: "whatif-changes"}, h("strong", {}, `From position ${answer.position} (${clock(answer.at)}) to ${clock(answer.until)}: `),
        changes, h("span", {class: "muted"}, ` · ${num(answer.events)} recorded events re-run`)),
      h("div", {class: "scroll-x"}, h("table", {class: "diff", id: "whatif-table"},
        h("thead", {}, h("tr", {}, ["", "recorded", "what-if", "change"].map((c) => h("th", {scope: "col"}, c)))),
        h("tbody", {}, answer.rows.map((r) => h("tr", {"data-measure": r.measure, class: r.change ? "changed" : null},
          h("th", {scope: "row"}, r.measure), h("td", {class: "num"}, r.recorded === null ? "–" : num(r.recorded)),
          h("td", {class: "num"}, r.whatif === null ? "–" : num(r.whatif)),
          h("td", {class: "num"}, r.change ? `${r.change > 0 ? "+" : ""}${num(r.change)}` : "")))))));
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const at = position();
    if (at === null) {
      setText(status, "Pick a position in the log first (the slider, the axis or a line of the story).");
      return;
    }
    const mine = ++seq;
    run.disabled = true;
    setText(status, `Re-running from position ${at}…`);
    try {
      if (!base) await fill();
      const answer = await ctx.api.post(`/api/agents/${encodeURIComponent(agentId)}/whatif`, {position: at, config: chosen()});
      if (mine !== seq) return;
      setText(status, "");
      show(answer);
    } catch (error) {
      if (mine === seq) setText(status, `What-if failed: ${error.message}`);
    } finally {
      run.disabled = false;
    }
  });
  fill().catch(() => {});  // (tried again on the first run)
  return {el};
}
