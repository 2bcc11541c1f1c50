// Capacity over time, from the log (GET /api/capacity): pending requests and run latency
// (p50, p95) for the desk and its busiest (or chosen) agents, and each provider gate's
// waiting requests, waits for a slot and use of its requests-per-minute and token limits,
// with stops, resumes, holds, limit changes and the breaker as marks. Zoom: drag across a
// chart to brush a stretch of time, the buttons, or + and − on a focused chart (arrows pan,
// 0 goes back); the window, the zoom and the agents are in the address.

import {cssColour, drawChart} from "../chart.js";
import {h, replace, setAttr, setText} from "../dom.js";
import {age, between, clock, duration, hms, num, when} from "../format.js";

const WINDOWS = [[900_000, "last 15 minutes"], [3_600_000, "last hour"], [21_600_000, "last 6 hours"],
  [86_400_000, "last 24 hours"]];
const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600].map((s) => s * 1000);
const POINTS = 120;
const MIN_SPAN_MS = 60_000;
const MAX_SPAN_MS = 26 * 3_600_000;
const REFRESH_MS = 10_000;
const BRUSH_PX = 6;
const PALETTE = ["#1f77b4", "#e8731a", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f8c8d",
  "#bcbd22", "#17becf"];
const MARK_COLOUR = {stop: "--bad", pause: "--warn", held: "--warn", resume: "--good", limits: "--control",
  breaker: "--bad", closed: "--good"};
const MARK_LABEL = {stop: "■ stop", pause: "‖ pause", held: "‖ held", resume: "▶ resume", limits: "⚙ limits",
  breaker: "⚡ breaker", closed: "✓ breaker closed"};
const MARK_TYPES = new Set(["ControlApplied", "RunsHeld", "RunsUnheld", "GateLimitsApplied", "BreakerOpened",
  "BreakerClosed"]);
const percent = (v) => `${Math.round(v * 100)}%`;

/**
 * The charts, each: its key, title, unit formatter, and its lines from an answer
 * ({label, colour, dash, values}); `use` charts are shares of a limit.
 */
const CHARTS = [
  {key: "depth", title: "Pending requests (most at any second)", format: num, whole: true,
    lines: (a, c) => [{label: "desk", colour: c.desk, values: a.desk.depth, width: 3},
      ...a.agents.map((x) => ({label: x.agentId, colour: c.agent(x.agentId), values: x.depth}))]},
  {key: "latency", title: "Run latency: p95 solid, p50 dashed", format: duration, whole: true,
    lines: (a, c) => [{label: "desk p95", colour: c.desk, values: a.desk.p95, width: 3},
      {label: "desk p50", colour: c.desk, values: a.desk.p50, dash: [5, 4]},
      ...a.agents.map((x) => ({label: `${x.agentId} p95`, colour: c.agent(x.agentId), values: x.p95}))]},
  {key: "waiting", title: "Waiting at the provider gates (most at any second)", format: num, whole: true,
    lines: (a, c) => a.gates.map((g) => ({label: g.provider, colour: c.gate(g.provider), values: g.waiting}))},
  {key: "waits", title: "Gate waits for a slot: p95 solid, p50 dashed", format: duration, whole: true,
    lines: (a, c) => a.gates.flatMap((g) => [
      {label: `${g.provider} p95`, colour: c.gate(g.provider), values: g.waitP95},
      {label: `${g.provider} p50`, colour: c.gate(g.provider), values: g.waitP50, dash: [5, 4]}])},
  {key: "rpm", title: "Requests per minute, share of the limit", format: percent, use: "requestsPerMinute",
    lines: (a, c) => a.gates.map((g) => ({label: g.provider, colour: c.gate(g.provider), values: g.requestUse,
      raw: g.requests}))},
  {key: "tpm", title: "Tokens per minute, share of the limit (input or output, the higher)", format: percent,
    use: "tokens", lines: (a, c) => a.gates.map((g) => ({label: g.provider, colour: c.gate(g.provider),
      values: g.tokenUse, raw: g.inputTokens.map((n, i) => n + g.outputTokens[i])}))},
];

/** A round step giving at most about `POINTS` points over `span` ms. */
function stepFor(span) {
  return STEPS.find((s) => span / s <= POINTS) ?? STEPS.at(-1);
}

function markText(m) {
  return `${m.agentId ?? `provider ${m.provider}`}: ${m.text}`;
}

export function createCapacity(ctx) {
  const section = document.getElementById("capacity-view");
  const range = h("select", {id: "capacity-range"}, WINDOWS.map(([ms, label]) => h("option", {value: ms}, label)));
  range.value = "3600000";
  const agentsInput = h("input", {type: "text", id: "capacity-agents", placeholder: "the busiest 5",
    autocomplete: "off", spellcheck: "false", "aria-describedby": "capacity-agents-help"});
  const zoomIn = h("button", {type: "button", id: "capacity-zoom-in"}, "+ Zoom in");
  const zoomOut = h("button", {type: "button", id: "capacity-zoom-out"}, "− Zoom out");
  const reset = h("button", {type: "button", id: "capacity-reset", hidden: true}, "Back to the window");
  const status = h("p", {class: "muted", id: "capacity-status", role: "status"}, "Loading…");
  const legend = h("ul", {class: "legend capacity-legend", id: "capacity-legend", "aria-label": "Series"});
  const tip = h("div", {class: "chart-tip", id: "capacity-tip", hidden: true, "aria-hidden": "true"});
  const marks = h("ul", {class: "list", id: "capacity-marks", "aria-label": "Marks in the window"});
  const figures = CHARTS.map((chart) => {
    const canvas = h("canvas", {id: `capacity-${chart.key}`, role: "img", tabindex: 0, "aria-label": chart.title});
    const band = h("div", {class: "brush", hidden: true, "aria-hidden": "true"});
    const note = h("p", {class: "muted chart-note"});
    const el = h("figure", {class: "card", "data-series": chart.key},
      h("figcaption", {}, h("h3", {}, chart.title)), h("div", {class: "brushable"}, canvas, band), note);
    return {...chart, canvas, band, note, el, geometry: null, cursor: null};
  });
  replace(section, h("h2", {id: "capacity-title"}, "Capacity"),
    h("div", {class: "toolbar"},
      h("label", {for: "capacity-range"}, "Window"), range,
      h("label", {for: "capacity-agents"}, "Agents"), agentsInput,
      h("span", {class: "sr-only", id: "capacity-agents-help"}, "comma-separated agent ids; empty: the busiest five"),
      h("div", {class: "zoom", role: "group", "aria-label": "Zoom"}, zoomIn, zoomOut, reset)),
    status, legend,
    h("div", {class: "charts capacity-charts live"}, figures.map((f) => f.el)),
    h("section", {class: "card chart-marks", "aria-labelledby": "capacity-marks-title"},
      h("h3", {id: "capacity-marks-title"}, "Marks in the window"), marks),
    tip);

  let data = null;
  let zoom = null;  // {from, to} while zoomed in on a stretch; null: the window up to now
  let named = [];   // agent ids asked for (empty: the busiest)
  let seq = 0;
  let lastLoad = 0;
  let soon = null;
  let brush = null;

  const colours = {
    desk: cssColour("--text"),
    agent: (id) => PALETTE[(data?.agents.findIndex((a) => a.agentId === id) ?? 0) % PALETTE.length],
    gate: (name) => PALETTE[(PALETTE.length - 1 - (data?.gates.findIndex((g) => g.provider === name) ?? 0)
      + PALETTE.length) % PALETTE.length],
  };

  range.addEventListener("input", () => { zoom = null; remember(); load(); });
  agentsInput.addEventListener("change", () => {
    named = agentsInput.value.split(",").map((s) => s.trim()).filter(Boolean);
    remember();
    load();
  });
  zoomIn.addEventListener("click", () => scale(0.5));
  zoomOut.addEventListener("click", () => scale(2));
  reset.addEventListener("click", () => { zoom = null; remember(); load(); });
  window.addEventListener("resize", () => { if (!section.hidden) draw(); });
  for (const f of figures) {
    f.canvas.addEventListener("pointerdown", (event) => start(f, event));
    f.canvas.addEventListener("pointermove", (event) => move(f, event));
    f.canvas.addEventListener("pointerup", (event) => end(f, event));
    f.canvas.addEventListener("pointercancel", () => { brush = null; f.band.hidden = true; });
    f.canvas.addEventListener("pointerleave", () => { if (!brush) tip.hidden = true; });
    f.canvas.addEventListener("blur", () => { tip.hidden = true; f.cursor = null; });
    f.canvas.addEventListener("keydown", (event) => key(f, event));
    f.canvas.addEventListener("dblclick", () => scale(2));
  }

  /** The stretch shown: the zoom, or the window up to now. */
  function span() {
    if (zoom) return zoom;
    const now = ctx.model.serverNow();
    return {from: now - Number(range.value), to: now};
  }

  function remember() {
    const query = new URLSearchParams(zoom ? {from: zoom.from, to: zoom.to} : {window: range.value});
    if (named.length) query.set("agents", named.join(","));
    history.replaceState(null, "", `#/capacity?${query}`);
  }

  /** Zoom around the middle by `factor` (0.5: in, 2: out), never past now. */
  function scale(factor) {
    const {from, to} = span();
    const now = ctx.model.serverNow();
    const width = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, (to - from) * factor));
    let middle = (from + to) / 2;
    middle = Math.min(middle, now - width / 2);
    zoom = {from: Math.round(middle - width / 2), to: Math.round(middle + width / 2)};
    remember();
    load();
  }

  /** Pan a zoomed stretch by `fraction` of its width (never past now). */
  function pan(fraction) {
    const {from, to} = span();
    const shift = Math.round((to - from) * fraction);
    const room = ctx.model.serverNow() - to;
    const by = Math.min(shift, room);
    zoom = {from: from + by, to: to + by};
    remember();
    load();
  }

  async function load() {
    soon = null;
    lastLoad = Date.now();
    const {from, to} = span();
    const step = stepFor(to - from);
    const start = Math.floor(from / step) * step;
    const end = Math.max(start + step, Math.ceil(to / step) * step);
    const mine = ++seq;
    try {
      const answer = await ctx.api.get("/api/capacity", {from: start, to: end, step,
        agent: named.length ? named.join(",") : null});
      if (mine !== seq) return;
      data = answer;
      section.dataset.position = answer.position;
      draw();
      if (answer.behind > 0 && soon === null) soon = setTimeout(load, 1000);  // the first read goes on
    } catch (error) {
      if (mine === seq) setText(status, `Cannot load capacity: ${error.message}`);
    }
  }

  function times() {
    return data.desk.depth.map((_, i) => data.from + i * data.step);
  }

  function draw() {
    if (!data) return;
    const {from, to, step} = data;
    const now = Date.now();
    reset.hidden = zoom === null;
    setText(status, `From the log: ${when(from, now)} to ${when(to, now)}, one point per `
      + `${step >= 60_000 ? `${step / 60_000} min` : `${step / 1000} s`} · ${data.desk.agents} agents on the desk`
      + ` · ${data.busiest ? "the busiest" : "chosen"}: ${data.agents.map((a) => a.agentId).join(", ") || "none"}`
      + ` · read at ${hms(now)}`
      + (data.since && data.since > from ? ` · the log is folded from ${when(data.since, now)} only` : "")
      + (data.behind > 0 ? ` · reading the log, ${num(data.behind)} events to go…` : ""));
    const at = times();
    const markers = data.marks.map((m) => ({t: m.at, colour: cssColour(MARK_COLOUR[m.kind] ?? "--control"),
      label: MARK_LABEL[m.kind] ?? m.kind}));
    const shown = [];
    for (const f of figures) {
      const lines = f.lines(data, colours);
      f.drawn = lines;
      f.geometry = drawChart(f.canvas, {from, to, axis: "clock", whole: f.whole ?? false, format: f.format, markers,
        lines: lines.map((l) => ({colour: l.colour, dash: l.dash, width: l.width,
          points: l.values.map((v, i) => [at[i] + step / 2, v])}))});
      const peaks = lines.map((l) => [l.label, Math.max(0, ...l.values.filter((v) => v !== null))]);
      setAttr(f.canvas, "aria-label", `${f.title}: most in the window `
        + (peaks.length ? peaks.map(([label, v]) => `${label} ${f.format(v)}`).join(", ") : "none")
        + (data.marks.length ? `; ${data.marks.length} mark${data.marks.length === 1 ? "" : "s"}` : ""));
      f.el.dataset.peak = peaks.length ? Math.max(...peaks.map(([, v]) => v)) : 0;
      if (f.use) {
        const unlimited = data.gates.filter((g) => (f.use === "tokens"
          ? g.limits.inputTokensPerMinute ?? g.limits.outputTokensPerMinute : g.limits[f.use]) == null);
        setText(f.note, unlimited.length ? `No limit to use: ${unlimited.map((g) => g.provider).join(", ")}` : "");
      } else if (!lines.length) {
        setText(f.note, "No provider gate.");
      }
      for (const l of lines) if (!shown.some(([label]) => label === l.label.split(" ")[0])) shown.push([l.label.split(" ")[0], l.colour]);
    }
    replace(legend, shown.map(([label, colour]) => h("li", {class: "swatch", style: `--swatch: ${colour}`}, label)));
    replace(marks, data.marks.length ? data.marks.slice().reverse().map((m) => h("li", {"data-kind": m.kind},
      h("span", {class: "swatch", style: `--swatch: var(${MARK_COLOUR[m.kind] ?? "--control"})`}, m.kind), " ",
      h("span", {class: "muted"}, `${when(m.at, now)} · ${age(m.at, now)} · `), markText(m),
      m.agentId ? [" ", h("a", {href: `#/agent/${encodeURIComponent(m.agentId)}?at=${m.position}`}, "time travel there")] : null))
      : h("li", {class: "muted"}, "None in this window."));
  }

  /** The step under x (px), or null outside the plot. */
  function stepAt(f, x) {
    const g = f.geometry;
    if (!data || !g || x < g.left || x > g.right) return null;
    return Math.min(data.desk.depth.length - 1, Math.max(0, Math.floor((g.time(x) - data.from) / data.step)));
  }

  function start(f, event) {
    if (!f.geometry || event.button !== 0) return;
    f.canvas.setPointerCapture?.(event.pointerId);
    brush = {figure: f, x0: event.offsetX, x1: event.offsetX};
  }

  function move(f, event) {
    if (brush && brush.figure === f) {
      brush.x1 = Math.max(f.geometry.left, Math.min(f.geometry.right, event.offsetX));
      const left = Math.min(brush.x0, brush.x1);
      const width = Math.abs(brush.x1 - brush.x0);
      f.band.hidden = width < BRUSH_PX;
      f.band.style.left = `${left}px`;
      f.band.style.width = `${width}px`;
      f.band.style.top = `${f.geometry.top}px`;
      f.band.style.height = `${f.geometry.bottom - f.geometry.top}px`;
      tip.hidden = true;
      return;
    }
    const i = stepAt(f, event.offsetX);
    if (i === null) tip.hidden = true;
    else tell(f, i, event.clientX, event.clientY);
  }

  function end(f, event) {
    if (!brush || brush.figure !== f) return;
    const {x0} = brush;
    const x1 = Math.max(f.geometry.left, Math.min(f.geometry.right, event.offsetX));
    brush = null;
    f.band.hidden = true;
    if (Math.abs(x1 - x0) < BRUSH_PX) return;  // a click, not a brush
    const t0 = f.geometry.time(Math.min(x0, x1));
    const t1 = f.geometry.time(Math.max(x0, x1));
    const width = Math.max(MIN_SPAN_MS, t1 - t0);
    const middle = (t0 + t1) / 2;
    zoom = {from: Math.round(middle - width / 2), to: Math.round(middle + width / 2)};
    remember();
    load();
  }

  /** Keys on a focused chart: arrows step the tooltip (with Shift: pan), + and − zoom, 0 back. */
  function key(f, event) {
    if (!data || !f.geometry) return;
    const last = data.desk.depth.length - 1;
    if (event.key === "+" || event.key === "=") scale(0.5);
    else if (event.key === "-" || event.key === "_") scale(2);
    else if (event.key === "0") { zoom = null; remember(); load(); }
    else if (event.shiftKey && (event.key === "ArrowLeft" || event.key === "ArrowRight")) {
      pan(event.key === "ArrowLeft" ? -0.25 : 0.25);
    } else if (["ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) {
      const moves = {ArrowLeft: (f.cursor ?? last + 1) - 1, ArrowRight: (f.cursor ?? last - 1) + 1, Home: 0, End: last};
      const i = Math.min(last, Math.max(0, moves[event.key]));
      const box = f.canvas.getBoundingClientRect();
      const g = f.geometry;
      tell(f, i, box.left + g.left + ((i + 0.5) / (last + 1)) * (g.right - g.left), box.top + g.top);
    } else {
      return;
    }
    event.preventDefault();
  }

  /** The values of every line of a chart in step `i`, in the tooltip near (clientX, clientY). */
  function tell(f, i, clientX, clientY) {
    f.cursor = i;
    const start = data.from + i * data.step;
    const inside = data.marks.filter((m) => m.at >= start && m.at < start + data.step);
    replace(tip, h("strong", {}, `${f.title} · ${between(start, start + data.step)}`),
      h("ul", {}, (f.drawn ?? []).map((l) => h("li", {class: "swatch", style: `--swatch: ${l.colour}`},
        `${l.label}: ${l.values[i] === null ? "–" : f.format(l.values[i])}`
        + (l.raw ? ` (${num(l.raw[i])} in 60 s)` : "")))),
      inside.map((m) => h("p", {class: "mark"}, `${MARK_LABEL[m.kind] ?? m.kind} ${clock(m.at).slice(0, 8)} ${markText(m)}`)));
    tip.hidden = false;
    const box = tip.getBoundingClientRect();
    tip.style.left = `${Math.max(8, Math.min(clientX + 14, window.innerWidth - box.width - 8))}px`;
    tip.style.top = `${Math.max(8, Math.min(clientY + 14, window.innerHeight - box.height - 8))}px`;
  }

  return {
    section,
    title: "Capacity",
    show(params) {
      if (params.window && WINDOWS.some(([ms]) => String(ms) === params.window)) range.value = params.window;
      const from = Number(params.from);
      const to = Number(params.to);
      zoom = Number.isFinite(from) && Number.isFinite(to) && from < to ? {from, to} : null;
      named = (params.agents ?? "").split(",").map((s) => s.trim()).filter(Boolean);
      agentsInput.value = named.join(", ");
      load();
    },
    change(detail) {
      if (soon === null && detail.events.some((e) => MARK_TYPES.has(e.type))) {
        soon = setTimeout(load, 300);  // a stop, a resume or a limit change shows at once
      }
    },
    tick() {
      if (zoom === null && Date.now() - lastLoad > REFRESH_MS) load();
    },
  };
}
