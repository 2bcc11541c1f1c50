// Time travel as a story: one agent's stream on a zoomable time axis (SVG, markers coloured
// by kind), and at any picked position, rebuilt by the gateway from the log: the queue as it
// was, the agent's budgets, cooldown, holds and provider gate at that moment, the story
// around it (inputs with the decisions they caused, in the CLI timeline's words), jumps to
// the next or previous stop, drop or suppression, and the diff between two positions.

import {h, keepingFocus, replace, setAttr, setText, stateBadge} from "../dom.js";
import {budget, clock, duration, num, ZONE} from "../format.js";
import {pendingTable, runCard} from "./queue.js";

const DEBOUNCE_MS = 120;
const AROUND = 0;  // raw events around the position: the story shows them, worded
const GROUPS_AROUND = 3;
const HEIGHT = 92;
const BASE = 58;  // y of the axis line
const PAD = 10;
const MIN_SPAN_MS = 20;
const SVG = "http://www.w3.org/2000/svg";

/** The kinds of marker, in legend order: label and CSS colour variable. */
const KINDS = [
  ["input", "input", "--input"], ["run", "run", "--good"], ["order", "order", "--story-order"],
  ["control", "control", "--control"], ["stop", "stop", "--halted"], ["drop", "drop", "--story-drop"],
  ["suppression", "suppression", "--story-suppression"], ["hold", "hold", "--story-suppression"],
  ["error", "error", "--story-error"], ["decision", "other decision", "--decision"],
];
const JUMPS = [["stop", "stop"], ["drop", "drop"], ["suppression", "suppression"]];
const ERRORS = new Set(["RunFailed", "RunAborted", "RequestRejected", "OrderRejected", "OperatorRejected",
  "AgentCallRejected"]);
const ORDERS = new Set(["OrderAccepted", "OrderFilled", "OrderClosed", "OrderCancelRequested"]);
const CONTROLS = new Set(["ControlApplied", "OperatorApplied", "RunsUnheld", "RunsResumed"]);
const RUNS = new Set(["RunStarted", "RunCompleted", "RunSteered"]);

/** A marker's kind for a raw event (the gateway's `kinds` say the same of decisions). */
export function kindOf(e) {
  if (e.input) return "input";
  if (e.type === "ControlApplied" && e.data?.to_state === "HALTED") return "stop";
  if (CONTROLS.has(e.type)) return "control";
  if (e.type === "RequestDropped" || e.type === "RequestSummarized") return "drop";
  if (e.type === "RunsSuppressed") return "suppression";
  if (e.type === "RunsHeld") return "hold";
  if (RUNS.has(e.type)) return "run";
  if (ORDERS.has(e.type)) return "order";
  if (ERRORS.has(e.type)) return "error";
  return "decision";
}

/** Tick steps of the time axis, in ms. */
const STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5,
  9e5, 18e5, 36e5, 72e5, 108e5, 216e5, 432e5, 864e5, 1728e5, 6048e5];

/** An axis label at the precision of the step: "14:02:05.250", "14:02:05", "14:02", "27 Nov". */
export function tickLabel(ms, step, withDate) {
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const date = d.toLocaleDateString("en-GB", {day: "numeric", month: "short"});  // as elsewhere
  if (step >= 864e5) return date;
  let text = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (step < 6e4) text += `:${pad(d.getSeconds())}`;
  if (step < 1e3) {  // as many decimals as the step needs: .5, .25, .125
    const decimals = step >= 100 ? 1 : step >= 10 ? 2 : 3;
    text += `.${pad(d.getMilliseconds(), 3).slice(0, decimals)}`;
  }
  return withDate ? `${date} ${text}` : text;
}

const MIN_TICK_PX = 8;  // ticks closer than this are a smear, not a scale
const LABEL_GAP = 8;  // px at least between two labels of the axis
const ruler = document.createElement("canvas").getContext("2d");
ruler.font = "11px system-ui, sans-serif";  // as text.tick in panel.css

/** How wide an axis label is drawn, in px, with a pixel of air each side. */
function labelWidth(text) {
  return ruler.measureText(text).width + 2;
}

/**
 * The ticks of a time axis `width` px wide from `start` to `end` (ms), on round local times:
 * {step, withDate, ticks: [{t, at (x in px), label (null: a mark alone)}]}. The step is the
 * finest whose labels have a label's width between them; where that shows fewer than two
 * labels (the first cut by an edge, the next too near the first's zone), a finer one,
 * labelled where there is room. The first label says the zone ("14:05 UTC"), as every time
 * of the panel does.
 */
export function axisTicks(start, end, width) {
  const span = Math.max(1, end - start);
  const px = (ms) => (ms / span) * (width - 2 * PAD);
  const dated = (step) => span > 864e5 / 2 && step < 864e5;
  const roomy = STEPS.findIndex((s) => px(s) >= 2 * labelWidth(tickLabel(end, s, dated(s))));
  let fallback = null;
  for (let i = roomy < 0 ? STEPS.length - 1 : roomy; i >= 0 && (!fallback || px(STEPS[i]) >= MIN_TICK_PX); i--) {
    const step = STEPS[i];
    const axis = {step, withDate: dated(step), ticks: labelledTicks(start, end, width, step, dated(step))};
    if (axis.ticks.filter((tick) => tick.label).length >= 2) return axis;
    fallback ??= axis;
  }
  return fallback;
}

/** Ticks every `step` ms, labelled where the label fits inside the axis, clear of the last. */
function labelledTicks(start, end, width, step, withDate) {
  const x = (t) => PAD + ((t - start) / Math.max(1, end - start)) * (width - 2 * PAD);
  const offset = new Date(start).getTimezoneOffset() * 60_000;  // ticks on local boundaries
  const ticks = [];
  let last = null;  // where the last label ends
  for (let t = Math.ceil((start - offset) / step) * step + offset; t <= end; t += step) {
    const at = x(t);
    const label = tickLabel(t, step, withDate) + (last === null ? ` ${ZONE}` : "");
    const half = labelWidth(label) / 2;
    const fits = at - half >= 0 && at + half <= width && (last === null || at - half >= last + LABEL_GAP);
    ticks.push({t, at, label: fits ? label : null});
    if (fits) last = at + half;
  }
  return ticks;
}

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

function value(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number" && v > 1e12) return clock(v);  // a time of the log
  return String(v);
}

export function createTimeline(ctx, agentId, {loadEarlier}) {
  let entries = [];
  let index = null;  // the picked event; null while following live
  let more = false;
  let seq = 0;
  let timer = null;
  let view = null;  // {start, end} in ms; null: everything loaded
  let drag = null;
  let compare = {from: null, to: null};
  let diffSeq = 0;

  const axis = svg("svg", {id: "travel-axis", class: "axis", role: "img", height: HEIGHT, tabindex: 0,
    "aria-label": `Time axis of ${agentId}'s log: wheel, + and − to zoom, drag or arrow keys to pan, 0 to show all, click to pick`});
  const axisBox = h("div", {class: "axis-box"}, axis);
  const range = h("p", {id: "travel-range", class: "muted"});
  const zoomIn = h("button", {type: "button", id: "zoom-in", "aria-label": "Zoom in"}, "+ Zoom in");
  const zoomOut = h("button", {type: "button", id: "zoom-out", "aria-label": "Zoom out"}, "− Zoom out");
  const zoomFit = h("button", {type: "button", id: "zoom-fit"}, "Show all");
  const legend = h("ul", {class: "legend", id: "travel-legend", "aria-label": "Marker colours"},
    KINDS.map(([kind, label, colour]) => h("li", {"data-kind": kind},
      h("span", {class: "swatch", style: `background: var(${colour})`, "aria-hidden": "true"}), label)));
  const slider = h("input", {type: "range", min: 0, max: 0, value: 0, step: 1, id: "travel-slider",
    "aria-label": `Log position of ${agentId}`, "aria-describedby": "travel-label"});
  const label = h("p", {id: "travel-label", class: "muted"});
  const earlier = h("button", {type: "button", id: "travel-earlier"}, "Load earlier events");
  const prev = h("button", {type: "button", id: "travel-prev"}, "◀ Previous input");
  const next = h("button", {type: "button", id: "travel-next"}, "Next input ▶");
  const live = h("button", {type: "button", id: "travel-live"}, "Back to live");
  const jumpResult = h("p", {id: "jump-result", class: "muted", role: "status"});
  const jumps = h("div", {class: "toolbar", role: "toolbar", "aria-label": "Jump to"},
    h("span", {class: "muted"}, "Jump to:"),
    JUMPS.flatMap(([kind, word]) => [
      h("button", {type: "button", "data-jump": kind, "data-direction": "previous", onclick: () => jump(kind, -1)}, `◀ Previous ${word}`),
      h("button", {type: "button", "data-jump": kind, "data-direction": "next", onclick: () => jump(kind, 1)}, `Next ${word} ▶`)]));
  const compareFrom = h("button", {type: "button", id: "diff-from"}, "Compare from here");
  const compareTo = h("button", {type: "button", id: "diff-to"}, "Compare to here");
  const compareLabel = h("span", {id: "diff-range", class: "muted"}, "Pick two positions to see what changed between them.");
  const diff = h("div", {id: "travel-diff", "aria-live": "polite"});
  const result = h("div", {id: "replay", class: "travel", "aria-live": "polite"});
  const el = h("section", {class: "timeline card", "aria-labelledby": "travel-title"},
    h("h3", {id: "travel-title"}, "Time travel"),
    h("p", {class: "muted"}, "Pick a position in this agent's log to see its queue, budgets and provider gate exactly as they were then (replayed from the log by the gateway), and the story around it: each input with the decisions it caused, worded as the CLI timeline words them. Arrow keys step one event, Page Up/Down ten."),
    axisBox, range,
    h("div", {class: "toolbar"}, zoomIn, zoomOut, zoomFit, legend),
    slider, label, h("div", {class: "toolbar"}, prev, next, live, earlier),
    jumps, jumpResult,
    h("div", {class: "toolbar compare"}, compareFrom, compareTo, compareLabel), diff,
    result);

  slider.addEventListener("input", () => pick(Number(slider.value)));
  prev.addEventListener("click", () => step(-1));
  next.addEventListener("click", () => step(1));
  live.addEventListener("click", () => {
    index = null;
    seq += 1;
    link(null);
    update();
    replace(result, h("p", {class: "muted"}, "Following live. Pick a position to travel back."));
    delete result.dataset.position;
  });
  earlier.addEventListener("click", async () => {
    earlier.disabled = true;
    try { await loadEarlier(); } finally { earlier.disabled = false; }
  });
  zoomIn.addEventListener("click", () => zoom(0.5, focusTime()));
  zoomOut.addEventListener("click", () => zoom(2, focusTime()));
  zoomFit.addEventListener("click", () => { view = null; draw(); });
  compareFrom.addEventListener("click", () => setCompare("from"));
  compareTo.addEventListener("click", () => setCompare("to"));
  axis.addEventListener("keydown", (event) => {
    const keys = {"+": () => zoom(0.5, focusTime()), "=": () => zoom(0.5, focusTime()),
      "-": () => zoom(2, focusTime()), "0": () => { view = null; draw(); },
      ArrowLeft: () => pan(-0.2), ArrowRight: () => pan(0.2)};
    const act = keys[event.key];
    if (!act || !entries.length) return;
    event.preventDefault();
    act();
  });
  new ResizeObserver(() => draw()).observe(axisBox);
  axis.addEventListener("wheel", (event) => {
    if (!entries.length) return;
    event.preventDefault();
    zoom(event.deltaY > 0 ? 1.25 : 0.8, timeAt(event.clientX));
  }, {passive: false});
  axis.addEventListener("pointerdown", (event) => {
    if (!entries.length) return;
    const [start, end] = bounds();
    drag = {x: event.clientX, start, end, moved: false};
    axis.setPointerCapture(event.pointerId);
  });
  axis.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    if (Math.abs(dx) > 3) drag.moved = true;
    if (!drag.moved) return;
    const shift = (dx / Math.max(1, axis.clientWidth - 2 * PAD)) * (drag.end - drag.start);
    view = {start: drag.start - shift, end: drag.end - shift};
    draw();
  });
  axis.addEventListener("pointerup", (event) => {
    const was = drag;
    drag = null;
    if (!was || was.moved || !entries.length) return;
    const t = timeAt(event.clientX);
    let best = 0;
    for (let i = 1; i < entries.length; i++) {
      if (Math.abs(entries[i].recordedAt - t) < Math.abs(entries[best].recordedAt - t)) best = i;
    }
    pick(best);
  });
  result.append(h("p", {class: "muted"}, "Following live. Pick a position to travel back."));

  /** The time range everything loaded covers, padded a little. */
  function full() {
    const first = entries[0].recordedAt;
    const last = entries[entries.length - 1].recordedAt;
    const pad = Math.max(MIN_SPAN_MS, (last - first) * 0.02);
    return [first - pad, last + pad];
  }

  function bounds() {
    return view ? [view.start, view.end] : full();
  }

  function timeAt(clientX) {
    const rect = axis.getBoundingClientRect();
    const [start, end] = bounds();
    const share = (clientX - rect.left - PAD) / Math.max(1, rect.width - 2 * PAD);
    return start + Math.min(1, Math.max(0, share)) * (end - start);
  }

  function focusTime() {
    if (index !== null) return entries[index].recordedAt;
    const [start, end] = bounds();
    return (start + end) / 2;
  }

  /** Zoom by `factor` (below 1: in) keeping `center` where it is on the axis. */
  function zoom(factor, center) {
    if (!entries.length) return;
    const [start, end] = bounds();
    const [first, last] = full();
    const span = Math.min(Math.max(MIN_SPAN_MS, (end - start) * factor), (last - first) * 4);
    const share = (center - start) / Math.max(1, end - start);
    view = {start: center - share * span, end: center - share * span + span};
    draw();
  }

  /** Move the shown time range by a share of its width (negative: earlier). */
  function pan(share) {
    const [start, end] = bounds();
    const shift = (end - start) * share;
    view = {start: start + shift, end: end + shift};
    draw();
  }

  /** Move to the previous or next input (the start of the decisions it caused). */
  function step(direction) {
    if (!entries.length) return;
    let i = index === null ? entries.length - 1 : index;
    do { i += direction; } while (i > 0 && i < entries.length - 1 && !entries[i].input);
    pick(Math.min(entries.length - 1, Math.max(0, i)));
  }

  function pick(i) {
    index = i;
    const t = entries[i].recordedAt;
    if (view && (t < view.start || t > view.end)) {  // keep the pick in sight
      const half = (view.end - view.start) / 2;
      view = {start: t - half, end: t + half};
    }
    update();
    clearTimeout(timer);
    const position = entries[i].position;
    link(position);
    timer = setTimeout(() => show(position), DEBOUNCE_MS);
  }

  /** Keep the address on the picked position (#/agent/ID?at=P) so it can be shared or
   * reloaded; replaced, not pushed, and without a route change. */
  function link(position) {
    if (!location.hash.startsWith(`#/agent/${encodeURIComponent(agentId)}`)) return;
    const at = position === null ? "" : `?at=${position}`;
    history.replaceState(history.state, "", `#/agent/${encodeURIComponent(agentId)}${at}`);
  }

  function currentPosition() {
    const e = entries[index ?? entries.length - 1];
    return e ? e.position : 0;
  }

  async function jump(kind, direction) {
    const mine = ++seq;
    const here = currentPosition();
    const params = direction > 0 ? {kind, after: here} : {kind, before: here};
    setText(jumpResult, `Looking for the ${direction > 0 ? "next" : "previous"} ${kind}…`);
    let answer;
    try {
      answer = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/story/find`, params);
    } catch (error) {
      setText(jumpResult, `Jump failed: ${error.message}`);
      return;
    }
    if (mine !== seq) return;
    if (answer.position == null) {
      setText(jumpResult, `No ${direction > 0 ? "later" : "earlier"} ${kind} in ${agentId}'s log (from position ${here}).`);
      return;
    }
    setText(jumpResult, `${direction > 0 ? "Next" : "Previous"} ${kind}: position ${answer.position}.`);
    await travel(answer.position);
  }

  async function show(position) {
    const mine = ++seq;
    const path = `/api/agents/${encodeURIComponent(agentId)}`;
    let answers;
    try {
      answers = await Promise.all([
        ctx.api.get("/api/replay", {agent: agentId, position, around: AROUND}),
        ctx.api.get(`${path}/moment`, {position}),
        ctx.api.get(`${path}/story`, {at: position, around: GROUPS_AROUND}),
      ]);
    } catch (error) {
      if (mine === seq) replace(result, h("p", {class: "error"}, `Replay failed: ${error.message}`));
      return;
    }
    if (mine !== seq) return;  // a later pick is on its way
    render(...answers);
  }

  function render(answer, moment, story) {
    const queue = answer.queue;
    result.dataset.position = answer.position;
    keepingFocus(result, () => replace(result,
      h("div", {},
        h("h4", {}, `Queue as at position ${answer.position} (${clock(answer.at)})`),
        h("dl", {class: "facts"},
          h("dt", {}, "Trading"), h("dd", {}, stateBadge(answer.status.trading)),
          h("dt", {}, "Lane"), h("dd", {}, queue.busy ? "busy" : "idle"),
          h("dt", {}, "Stream version"), h("dd", {}, String(answer.version))),
        runCard(queue.run, {kinds: ctx.model.kinds}),
        h("h4", {}, `Pending then (${queue.pending.length})`),
        h("div", {class: "scroll-x"}, pendingTable(queue.pending, {id: "replay-pending", label: `Pending requests at position ${answer.position}`})),
        momentView(moment)),
      h("div", {},
        h("h4", {}, "The story around it"),
        storyView(story, answer.eventPosition))));
  }

  function momentView(m) {
    const b = m.budgets;
    const cooling = b.cooldownRemainingMs ? `${duration(b.cooldownRemainingMs)} left (until ${clock(b.cooldownUntil)})`
      : b.noTradeCooldownMs ? `none (${duration(b.noTradeCooldownMs)} after a no-trade run)` : "off";
    const positions = Object.entries(m.positions);
    return h("section", {id: "moment", "aria-labelledby": "moment-title", "data-position": m.position},
      h("h4", {id: "moment-title"}, `Budgets, holds and gate at that moment (agent time ${clock(m.at)})`),
      h("dl", {class: "facts"},
        h("dt", {}, "Why"), h("dd", {id: "moment-why"}, m.why),
        h("dt", {}, "Runs, last hour"), h("dd", {id: "moment-hour"}, budget(b.runsLastHour, b.maxRunsPerHour)),
        h("dt", {}, "Runs, last day"), h("dd", {}, budget(b.runsLastDay, b.maxRunsPerDay)),
        h("dt", {}, "Cooldown"), h("dd", {}, cooling),
        h("dt", {}, "Suppressed"), h("dd", {id: "moment-suppressed"},
          m.suppressed ? `yes, ${m.suppressed.reason} budget, until ${clock(m.suppressed.until)}` : "no"),
        h("dt", {}, "Held"), h("dd", {}, m.held ?? "no"),
        h("dt", {}, "Pending"), h("dd", {}, num(m.pending.length)),
        h("dt", {}, "Open orders"), h("dd", {}, m.orders.length
          ? m.orders.map((o) => `${o.orderId} ${o.side} ${o.qty} ${o.symbol} (${o.filled} filled)`).join("; ") : "none"),
        h("dt", {}, "Positions"), h("dd", {}, positions.length ? positions.map(([s, q]) => `${s} ${q}`).join(", ") : "flat")),
      gateView(m.gate));
  }

  function gateView(g) {
    if (!g || g.provider === null) return h("p", {class: "muted", id: "moment-gate"}, `Provider gate: ${g ? g.note : "unknown"}.`);
    if (g.at == null) {
      return h("p", {id: "moment-gate"}, h("strong", {}, `Provider gate ${g.provider}: `), `${g.note}.`);
    }
    const lines = [
      ...g.waiting.map((w) => h("li", {"data-run": w.runId},
        `${w.runId} waiting ${duration(w.waitedMs)} (${w.priority}, ~${num(w.tokens)} tokens): ${w.why}`)),
      ...g.inFlight.map((l) => h("li", {"data-run": l.runId}, `${l.runId} holds a slot since ${clock(l.grantedAt)}`)),
    ];
    return h("div", {id: "moment-gate"},
      h("p", {}, h("strong", {}, `Provider gate ${g.provider}: `),
        `${g.inFlightAll ?? 0} in flight of ${g.maxConcurrent ?? "∞"}, `
          + `${g.windowRequests ?? 0} requests in the last minute of ${g.requestsPerMinute ?? "∞"}, breaker ${g.breaker}`
          + (g.nextDecisionAt ? `, next decision ${clock(g.nextDecisionAt)}` : "")),
      lines.length ? h("ul", {class: "list"}, lines) : h("p", {class: "muted"}, "Nothing of this agent's at the gate then."),
      h("p", {class: "muted small"}, `${g.note[0].toUpperCase()}${g.note.slice(1)} (${clock(g.at)}).`));
  }

  function storyView(story, current) {
    if (!story.groups.length) return h("p", {class: "muted"}, "No inputs yet at this position.");
    return h("ol", {class: "story", id: "story", "aria-label": "Inputs and the decisions they caused"},
      story.groups.map((g, i) => h("li", {class: `group ${g.kinds.map((k) => `kind-${k}`).join(" ")}`,
        "data-position": g.position, "data-current": i === story.index ? "true" : null},
        line(g, current, false),
        g.decisions.length ? h("ul", {class: "decisions"}, g.decisions.map((d) => line(d, current, true))) : null)));
  }

  function line(item, current, decision) {
    const kind = decision ? (item.kinds[0] || "decision") : "input";
    const el = h(decision ? "li" : "div", {class: `said kind-${kind}`, tabindex: 0, role: "button",
      "data-position": item.position, "data-focus-key": item.position, "data-kind": kind,
      "aria-current": item.position === current ? "true" : null},
      h("span", {class: "mono pos"}, item.position),
      decision ? h("span", {class: "arrow", "aria-hidden": "true"}, "→") : h("time", {class: "mono"}, clock(item.at)),
      h("span", {class: "say"}, item.text),
      h("span", {class: "tag type"}, item.type));
    const go = () => travel(item.position);
    el.addEventListener("click", (event) => { event.stopPropagation(); go(); });
    el.addEventListener("keydown", (k) => { if (k.key === "Enter" || k.key === " ") { k.preventDefault(); go(); } });
    return el;
  }

  /** Pick the event at or just before a log position, loading earlier pages if needed. */
  async function travel(position) {
    for (let page = 0; page < 20 && more && entries.length && entries[0].position > position; page++) {
      await loadEarlier();
    }
    let i = -1;
    for (let j = 0; j < entries.length && entries[j].position <= position; j++) i = j;
    if (i >= 0) pick(i);
  }

  function setCompare(end) {
    if (!entries.length) return;
    compare = {...compare, [end]: currentPosition()};
    showDiff();
  }

  async function showDiff() {
    const {from, to} = compare;
    setText(compareLabel, `From ${from ?? "–"} to ${to ?? "–"}${from === null || to === null ? ": pick the other end." : ""}`);
    if (from === null || to === null) return;
    const mine = ++diffSeq;
    let answer;
    try {
      answer = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/diff`, {from, to});
    } catch (error) {
      if (mine === diffSeq) replace(diff, h("p", {class: "error"}, `Diff failed: ${error.message}`));
      return;
    }
    if (mine !== diffSeq) return;
    diff.dataset.from = from;
    diff.dataset.to = to;
    const rows = [
      ...answer.changes.map((c) => [c.what, value(c.before), value(c.after)]),
      ...answer.pending.added.map((id) => ["pending", "–", `${id} added`]),
      ...answer.pending.removed.map((id) => ["pending", `${id}`, "removed"]),
      ...answer.orders.map((o) => [`order ${o.orderId}`, o.change === "opened" ? "–" : `${o.filledBefore ?? o.filled} filled`,
        `${o.change}: ${o.side} ${o.qty} ${o.symbol}, ${o.filled} filled`]),
      ...answer.positions.map((p) => [`position ${p.symbol}`, String(p.before), String(p.after)]),
    ];
    replace(diff,
      h("h4", {}, `What changed from position ${from} (${clock(answer.from.at)}) to ${to} (${clock(answer.to.at)})`),
      rows.length ? h("div", {class: "scroll-x"}, h("table", {id: "diff-table", class: "diff", "data-count": rows.length},
        h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "what"), h("th", {scope: "col"}, "before"), h("th", {scope: "col"}, "after"))),
        h("tbody", {}, rows.map(([what, before, after]) => h("tr", {"data-what": what},
          h("th", {scope: "row"}, what), h("td", {}, before), h("td", {}, after))))))
        : h("p", {class: "muted", id: "diff-table", "data-count": 0}, "Nothing changed between these positions."));
  }

  function update() {
    const n = entries.length;
    slider.max = Math.max(0, n - 1);
    slider.disabled = n === 0;
    slider.value = index === null ? n - 1 : index;
    earlier.hidden = !more;
    live.disabled = index === null;
    if (!n) {
      setText(label, "No events yet.");
    } else if (index === null) {
      setText(label, `Live · ${n} events loaded (positions ${entries[0].position}–${entries[n - 1].position})`);
    } else {
      const e = entries[index];
      setText(label, `Position ${e.position} · event ${index + 1} of ${n} · ${clock(e.recordedAt)} · ${e.type}`);
    }
    const e = entries[index ?? n - 1];
    setAttr(slider, "aria-valuetext", e ? `position ${e.position}, ${e.type}, ${clock(e.recordedAt)}` : "no events");
    draw();
  }

  function draw() {
    const width = axis.clientWidth || axis.parentElement?.clientWidth || 0;
    if (!width) return;
    axis.setAttribute("viewBox", `0 0 ${width} ${HEIGHT}`);
    axis.setAttribute("width", width);
    const n = entries.length;
    if (!n) {
      axis.replaceChildren();
      setText(range, "No events yet.");
      return;
    }
    const [start, end] = bounds();
    const span = Math.max(1, end - start);
    const x = (t) => PAD + ((t - start) / span) * (width - 2 * PAD);
    const colours = Object.fromEntries(KINDS.map(([kind, , colour]) => [kind, css(colour)]));
    const parts = [svg("line", {x1: PAD, x2: width - PAD, y1: BASE, y2: BASE, class: "axis-line"})];
    const {step: stepMs, withDate, ticks} = axisTicks(start, end, width);
    for (const {at, label} of ticks) {
      parts.push(svg("line", {x1: at, x2: at, y1: BASE, y2: BASE + 5, class: "tick-mark"}));
      if (label === null) continue;
      const text = svg("text", {x: at, y: BASE + 20, "text-anchor": "middle", class: "tick"});
      text.textContent = label;
      parts.push(text);
    }
    const picked = entries[index ?? n - 1].recordedAt;
    if (picked >= start && picked <= end) {  // under the markers, so none is hidden
      const px = x(picked);
      parts.push(svg("rect", {x: px - 4, y: 0, width: 8, height: BASE, class: "cursor"}),
        svg("path", {d: `M${px - 6} 0 L${px + 6} 0 L${px} 8 Z`, class: "cursor-head"}));
    }
    // One marker per pixel column and kind (a flood stays a few hundred elements), drawn
    // in legend order after routine decisions, so stops and drops stay on top.
    const columns = new Map();
    for (let i = 0; i < n; i++) {
      const e = entries[i];
      if (e.recordedAt < start || e.recordedAt > end) continue;
      const kind = kindOf(e);
      const key = `${kind}|${Math.round(x(e.recordedAt))}`;
      const column = columns.get(key);
      if (column) column.count += 1;
      else columns.set(key, {kind, first: e, count: 1});
    }
    const rank = (kind) => (kind === "decision" ? -1 : KINDS.findIndex(([k]) => k === kind));
    const marks = [...columns.values()].sort((p, q) => rank(p.kind) - rank(q.kind));
    for (const {kind, first: e, count} of marks) {
      const tall = kind === "input" ? 16 : kind === "decision" || kind === "run" ? 30 : 44;
      const mark = svg("rect", {x: x(e.recordedAt) - 1, y: BASE - tall - 2, width: 2, height: tall,
        fill: colours[kind], "data-kind": kind, "data-count": count});
      const title = svg("title");
      title.textContent = count > 1 ? `${count} ${kind} events from position ${e.position} (${clock(e.recordedAt)})`
        : `${e.position} · ${clock(e.recordedAt)} · ${e.type} (${kind})`;
      mark.append(title);
      parts.push(mark);
    }
    axis.replaceChildren(...parts);
    axis.dataset.spanMs = String(Math.round(span));
    axis.dataset.stepMs = String(stepMs);
    setText(range, `${tickLabel(start, 1, withDate)} – ${tickLabel(end, 1, withDate)} ${ZONE} · ${duration(span)} shown`
      + `${view ? "" : " (all loaded events)"} · ticks every ${duration(stepMs)}`);
  }

  return {
    el,
    /** The whole loaded stream (oldest first), whether there is more before it, and how
     * many of its events were just put in front (loaded earlier). */
    set(list, hasMore, prepended = 0) {
      if (index !== null) index += prepended;
      entries = list;
      more = hasMore;
      update();
    },
    /** Pick the event at or just before a log position (deep links: #/agent/ID?at=P). */
    travelTo: travel,
    redraw: draw,
    /** The picked log position (null while following live). */
    position: () => (index === null ? null : entries[index].position),
  };
}
