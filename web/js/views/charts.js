// Charts from the log (GET /api/charts), so a reload shows the same: per-agent series (runs
// started, tokens, requests received, drops, failed or aborted runs) over a window, with the
// emergency stops, pauses, resumes and provider holds as vertical marks saying who and when.
// Pointing at a chart (or the arrow keys on a focused one) shows the values at that time.
// The window and the agents shown are in the address (#/charts?window=...&agents=a,b), so a
// reload or a shared link keeps them.

import {cssColour, drawChart} from "../chart.js";
import {h, replace, setAttr, setText} from "../dom.js";
import {age, between, clock, hms, num, when} from "../format.js";

const WINDOWS = [[900_000, "last 15 minutes"], [3_600_000, "last hour"], [21_600_000, "last 6 hours"],
  [86_400_000, "last 24 hours"]];
const STEPS = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600].map((s) => s * 1000);
const POINTS = 120;
const MAX_AGENTS = 20;
const REFRESH_MS = 10_000;
const PALETTE = ["#1f77b4", "#e8731a", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f8c8d",
  "#bcbd22", "#17becf"];
const CHARTS = [["runs", "Runs started"], ["tokens", "Tokens (input + output)"], ["requests", "Requests received"],
  ["drops", "Requests dropped"], ["failures", "Runs failed or aborted"]];
const MARK_COLOUR = {stop: "--bad", pause: "--warn", held: "--warn", resume: "--good"};
const MARK_LABEL = {stop: "■ stop", pause: "‖ pause", held: "‖ held", resume: "▶ resume"};
const MARK_TYPES = new Set(["ControlApplied", "RunsHeld", "RunsUnheld"]);

/** A round step giving at most about `POINTS` points over `span` ms. */
function stepFor(span) {
  return STEPS.find((s) => span / s <= POINTS) ?? STEPS.at(-1);
}

function markText(m) {
  const what = m.kind === "held" ? `runs held by provider ${m.by}${m.detail ? `: ${m.detail}` : ""}`
    : `${m.action}${m.by ? ` by ${m.by}` : ""}`;
  return `${m.agentId}: ${what}${m.from && m.to ? ` (${m.from} → ${m.to})` : ""}`;
}

export function createCharts(ctx) {
  const section = document.getElementById("charts-view");
  const range = h("select", {id: "chart-range"}, WINDOWS.map(([ms, label]) => h("option", {value: ms}, label)));
  range.value = "3600000";
  const picker = h("fieldset", {class: "chart-agents", id: "chart-agents"}, h("legend", {}, "Agents"));
  const status = h("p", {class: "muted", id: "charts-status", role: "status"}, "Loading…");
  const tip = h("div", {class: "chart-tip", id: "chart-tip", hidden: true, "aria-hidden": "true"});
  const marks = h("ul", {class: "list", id: "chart-marks", "aria-label": "Stops, pauses, resumes and holds in the window"});
  const figures = CHARTS.map(([key, title]) => {
    const canvas = h("canvas", {id: `chart-${key}`, role: "img", "aria-label": title, tabindex: 0});
    const el = h("figure", {class: "card", "data-series": key}, h("figcaption", {}, h("h3", {}, title)), canvas);
    return {key, title, canvas, el, geometry: null, cursor: null};
  });
  replace(section, h("h2", {id: "charts-title"}, "Charts"),
    h("div", {class: "toolbar"}, h("label", {for: "chart-range"}, "Window"), range, picker),
    status,
    h("div", {class: "charts live"}, figures.map((f) => f.el)),
    h("section", {class: "card chart-marks", "aria-labelledby": "chart-marks-title"},
      h("h3", {id: "chart-marks-title"}, "Stops and resumes in the window"), marks),
    tip);

  let data = null;
  let chosen = null;  // agent ids shown (null: every agent, up to MAX_AGENTS)
  let known = "";
  let seq = 0;
  let lastLoad = 0;
  let soon = null;

  range.addEventListener("input", () => { remember(); load(); });
  window.addEventListener("resize", () => { if (!section.hidden) draw(); });
  for (const f of figures) {
    f.canvas.addEventListener("mousemove", (event) => point(f, event.offsetX, event.clientX, event.clientY));
    f.canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    f.canvas.addEventListener("blur", () => { tip.hidden = true; f.cursor = null; });
    f.canvas.addEventListener("keydown", (event) => step(f, event));
  }

  function agentIds() {
    const all = [...ctx.model.agents.keys()].sort();
    return chosen === null ? all.slice(0, MAX_AGENTS) : chosen.filter((id) => all.includes(id) || !all.length);
  }

  function colourOf(id) {
    const all = [...ctx.model.agents.keys()].sort();
    const index = all.indexOf(id);
    return PALETTE[(index < 0 ? 0 : index) % PALETTE.length];
  }

  /** The agent checkboxes, rebuilt when the agents change (then true). */
  function pick() {
    const all = [...ctx.model.agents.keys()].sort();
    const key = all.join(",");
    const changed = key !== known;
    if (changed) {
      known = key;
      replace(picker, h("legend", {}, "Agents"), all.map((id) => {
        const box = h("input", {type: "checkbox", value: id, "data-agent": id});
        box.addEventListener("input", () => {
          const ticked = [...picker.querySelectorAll("input:checked")].map((b) => b.value);
          chosen = ticked.length === all.length ? null : ticked;
          remember();
          load();
        });
        return h("label", {class: "swatch", style: `--swatch: ${colourOf(id)}`}, box, id);
      }));
    }
    const shown = new Set(agentIds());
    for (const box of picker.querySelectorAll("input")) box.checked = shown.has(box.value);
    return changed;
  }

  function remember() {
    const query = new URLSearchParams({window: range.value});
    if (chosen !== null) query.set("agents", chosen.join(","));
    history.replaceState(null, "", `#/charts?${query}`);
  }

  async function load() {
    soon = null;
    lastLoad = Date.now();
    const ids = agentIds();
    const span = Number(range.value);
    const step = stepFor(span);
    const to = Math.ceil(ctx.model.serverNow() / step) * step;
    const from = to - Math.ceil(span / step) * step;
    const mine = ++seq;
    if (!ids.length) {
      data = {from, to, step, agents: [], marks: []};
      draw();
      return;
    }
    try {
      const answer = await ctx.api.get("/api/charts", {agent: ids.join(","), from, to, step});
      if (mine !== seq) return;
      data = answer;
      draw();
    } catch (error) {
      if (mine === seq) setText(status, `Cannot load the charts: ${error.message}`);
    }
  }

  function markers() {
    return data.marks.map((m) => ({t: m.at, colour: cssColour(MARK_COLOUR[m.kind] ?? "--control"),
      label: MARK_LABEL[m.kind] ?? m.kind}));
  }

  function draw() {
    if (!data) return;
    const {from, to, step} = data;
    const truncated = data.agents.some((a) => a.truncated);
    setText(status, `From the log: ${when(from)} to ${when(to)}, one point per ${step >= 60_000 ? `${step / 60_000} min` : `${step / 1000} s`}`
      + ` · ${data.agents.length} agent${data.agents.length === 1 ? "" : "s"} · read at ${hms(Date.now())}`
      + (truncated ? " · some agents' logs were too long to read whole: their later points are missing" : ""));
    const marked = markers();
    for (const f of figures) {
      const lines = data.agents.map((a) => ({colour: colourOf(a.agentId),
        points: a.series[f.key].map((v, i) => [from + i * step, v])}));
      f.geometry = drawChart(f.canvas, {from, to, lines, markers: marked, axis: "clock", whole: true, format: num});
      const totals = data.agents.map((a) => [a.agentId, a.series[f.key].reduce((s, v) => s + v, 0)]);
      const total = totals.reduce((s, [, v]) => s + v, 0);
      f.el.dataset.total = total;
      setAttr(f.canvas, "aria-label", `${f.title}: ${num(total)} in the window`
        + (totals.length ? ` (${totals.map(([id, v]) => `${id} ${num(v)}`).join(", ")})` : "")
        + (data.marks.length ? `; ${data.marks.length} stop or resume mark${data.marks.length === 1 ? "" : "s"}` : ""));
    }
    const now = Date.now();
    replace(marks, data.marks.length ? data.marks.slice().reverse().map((m) => h("li", {"data-kind": m.kind, "data-position": m.position},
      h("span", {class: "swatch", style: `--swatch: var(${MARK_COLOUR[m.kind] ?? "--control"})`}, m.kind), " ",
      h("span", {class: "muted"}, `${when(m.at, now)} · ${age(m.at, now)} · `), markText(m), " ",
      h("a", {href: `#/agent/${encodeURIComponent(m.agentId)}?at=${m.position}`}, "time travel there")))
      : h("li", {class: "muted"}, "None in this window."));
  }

  /** The values of every agent at the time under the pointer, in a tooltip. */
  function point(f, x, clientX, clientY) {
    const g = f.geometry;
    if (!data || !g || x < g.left || x > g.right) {
      tip.hidden = true;
      return;
    }
    tell(f, Math.floor((g.time(x) - data.from) / data.step), clientX, clientY);
  }

  /** The arrow keys move a chart's tooltip from step to step (Home, End: first, last). */
  function step(f, event) {
    const g = f.geometry;
    if (!data || !g) return;
    const last = Math.ceil((data.to - data.from) / data.step) - 1;
    const moves = {ArrowLeft: (f.cursor ?? last + 1) - 1, ArrowRight: (f.cursor ?? last - 1) + 1, Home: 0, End: last};
    if (!(event.key in moves)) return;
    event.preventDefault();
    const i = Math.min(last, Math.max(0, moves[event.key]));
    const box = f.canvas.getBoundingClientRect();
    const x = g.left + ((i + 0.5) / (last + 1)) * (g.right - g.left);
    tell(f, i, box.left + x, box.top + g.top);
  }

  /** The values of every agent in step `i` of a chart, in the tooltip near (clientX, clientY). */
  function tell(f, i, clientX, clientY) {
    f.cursor = i;
    const start = data.from + i * data.step;
    const inside = data.marks.filter((m) => m.at >= start && m.at < start + data.step);
    replace(tip, h("strong", {}, `${f.title} · ${between(start, start + data.step)}`),
      h("ul", {}, data.agents.map((a) => h("li", {class: "swatch", style: `--swatch: ${colourOf(a.agentId)}`},
        `${a.agentId}: ${num(a.series[f.key][i] ?? 0)}`))),
      inside.map((m) => h("p", {class: "mark"}, `${MARK_LABEL[m.kind] ?? m.kind} ${clock(m.at).slice(0, 8)} ${markText(m)}`)));
    tip.hidden = false;
    const box = tip.getBoundingClientRect();
    const left = Math.min(clientX + 14, window.innerWidth - box.width - 8);
    const top = Math.min(clientY + 14, window.innerHeight - box.height - 8);
    tip.style.left = `${Math.max(8, left)}px`;
    tip.style.top = `${Math.max(8, top)}px`;
  }

  return {
    section,
    title: "Charts",
    show(params) {
      if (params.window && WINDOWS.some(([ms]) => String(ms) === params.window)) range.value = params.window;
      chosen = params.agents !== undefined ? params.agents.split(",").filter(Boolean) : null;
      pick();
      load();
    },
    change(detail) {
      if (detail.agents && pick()) load();  // (the agents arrive after a reload)
      const ids = new Set(agentIds());
      if (soon === null && detail.events.some((e) => MARK_TYPES.has(e.type) && ids.has(e.stream))) {
        soon = setTimeout(load, 300);  // a stop or a resume shows at once
      }
    },
    tick() {
      if (Date.now() - lastLoad > REFRESH_MS) load();
    },
  };
}
