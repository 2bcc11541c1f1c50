// A small canvas chart: lines and dots over a time window, axes labelled, vertical markers,
// colours from the page's CSS variables (so it follows light and dark). No library.

import {bareClock, ZONE} from "./format.js";

const PAD = {left: 56, right: 12, top: 10, bottom: 24};

export function cssColour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

/** The top of the y axis: four equal steps of a round size, at or above `value`. */
function axisTop(value) {
  const quarter = Math.max(value, 1e-9) / 4;
  const power = 10 ** Math.floor(Math.log10(quarter));
  for (const step of [1, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (step * power >= quarter) return 4 * step * power;
  return 40 * power;
}

const TICKS = [1, 5, 15, 30, 60, 300, 900, 1800, 3600, 10_800, 21_600, 43_200, 86_400].map((s) => s * 1000);

/** Wall-clock ticks between `from` and `to`, about one per 90 px: [[t, label]]; the first
 * label says the zone ("14:05 UTC", then "14:10", ...), as every time of the panel does. */
function clockTicks(from, to, width) {
  const span = to - from;
  const step = TICKS.find((s) => span / s <= Math.max(2, width / 90)) ?? TICKS.at(-1);
  const offset = new Date(from).getTimezoneOffset() * 60_000;  // ticks on local round times
  const ticks = [];
  for (let t = Math.ceil((from - offset) / step) * step + offset; t <= to; t += step) {
    const hms = bareClock(t).slice(0, 8);  // "14:05:00"
    const label = step < 60_000 ? hms : step >= 86_400_000
      ? new Date(t).toLocaleDateString("en-GB", {day: "numeric", month: "short"}) : hms.slice(0, 5);
    ticks.push([t, ticks.length ? label : `${label} ${ZONE}`]);
  }
  return ticks;
}

const CLUSTER_PX = 6;
const ROW_PX = 14;
const MAX_ROWS = 3;

/**
 * Vertical marks ({t, at: x, colour, label}, in x order) across `box`, labelled at its top
 * so that no two labels ever print on each other: marks a few pixels apart share one label
 * ("■ stop ×2 · ▶ resume ×2", or "■ stop +3" if that has no room); a label goes in the
 * first of up to three rows with room beside
 * its line, and where none has room it is left out (its line stays; the lists beside the
 * charts name every mark). Each label is drawn on the page's surface colour.
 */
function drawMarkers(g, marks, box) {
  const clusters = [];
  for (const m of marks) {
    g.strokeStyle = m.colour;
    g.lineWidth = 2;
    g.setLineDash([5, 3]);
    g.beginPath();
    g.moveTo(m.at, box.top);
    g.lineTo(m.at, box.bottom);
    g.stroke();
    g.setLineDash([]);
    const last = clusters.at(-1);
    if (last && m.at - last.to <= CLUSTER_PX) {
      last.marks.push(m);
      last.to = m.at;
    } else {
      clusters.push({from: m.at, to: m.at, marks: [m]});
    }
  }
  const rows = Math.max(1, Math.min(MAX_ROWS, Math.floor((box.bottom - box.top) / 3 / ROW_PX)));
  const ends = new Array(rows).fill(-Infinity);
  const surface = cssColour("--surface");
  g.textAlign = "left";
  g.textBaseline = "top";
  for (const cluster of clusters) {
    const named = cluster.marks.filter((m) => m.label);
    if (!named.length) continue;
    const counts = new Map();
    for (const m of named) counts.set(m.label, (counts.get(m.label) ?? 0) + 1);
    const texts = counts.size === 1
      ? [named.length === 1 ? named[0].label : `${named[0].label} ×${named.length}`]
      : [[...counts].map(([label, n]) => (n > 1 ? `${label} ×${n}` : label)).join(" · "),
        `${named[0].label} +${named.length - 1}`];
    let placed = null;
    for (const text of texts) {  // the whole story if it has room, else the short one
      const width = g.measureText(text).width + 4;
      let left = cluster.to + 3;  // right of the lines, or left of them where the plot ends
      if (left + width > box.right) left = cluster.from - 3 - width;
      left = Math.max(box.left, left);
      const row = ends.findIndex((end) => left >= end + 3 && left + width <= box.right);
      if (row >= 0) {
        placed = {text, width, left, row};
        break;
      }
    }
    if (placed === null) continue;
    const {text, width, left, row} = placed;
    ends[row] = left + width;
    const top = box.top + 1 + row * ROW_PX;
    g.globalAlpha = 0.85;
    g.fillStyle = surface;
    g.fillRect(left, top - 1, width, ROW_PX - 1);
    g.globalAlpha = 1;
    g.fillStyle = named[0].colour;
    g.fillText(text, left + 2, top);
  }
}

/**
 * Draw `lines` ({colour, points: [[t, v]], dash, width}: a null value is a gap) and `dots` ({t, v, colour}) between `from` and
 * `to` (ms); `format` labels the y axis. `axis: "clock"` labels the time axis with local
 * times (default: ages, "-2m" ... "now"); `markers` ({t, colour, label}) are vertical lines
 * across the plot, labelled at its top, never one label on another (`drawMarkers`); `whole`
 * makes the y axis step by whole numbers.
 * Returns where the plot is, for pointing at it ({left, right, top, bottom, time(x)}), or
 * null if the canvas is not shown.
 */
export function drawChart(canvas, {lines = [], dots = [], markers = [], from, to, format = String, axis = "relative",
  whole = false}) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (!width || !height) return null;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  let top = 0;
  for (const line of lines) for (const [t, v] of line.points) if (t >= from) top = Math.max(top, v);
  for (const dot of dots) if (dot.t >= from) top = Math.max(top, dot.v);
  top = axisTop(Math.max(top * 1.05, 1));
  if (whole) top = Math.max(4, Math.ceil(top / 4) * 4);  // counts: whole steps
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + ((t - from) / (to - from)) * plotW;
  const y = (v) => PAD.top + plotH - (v / top) * plotH;
  const muted = cssColour("--muted");
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = cssColour("--border");
  g.fillStyle = muted;
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    g.beginPath();
    g.moveTo(PAD.left, Math.round(y(v)) + 0.5);
    g.lineTo(width - PAD.right, Math.round(y(v)) + 0.5);
    g.stroke();
    g.fillText(format(v), PAD.left - 6, y(v));
  }
  g.textAlign = "center";
  g.textBaseline = "top";
  const span = to - from;
  if (axis === "clock") {
    for (const [t, label] of clockTicks(from, to, plotW)) {
      g.fillText(label, x(t), height - PAD.bottom + 6);
      g.fillRect(Math.round(x(t)), height - PAD.bottom, 1, 4);
    }
  } else {
    const step = span > 6 * 60_000 ? 120_000 : span > 2 * 60_000 ? 60_000 : 15_000;
    for (let back = 0; back <= span; back += step) {
      const t = to - back;
      g.fillText(back === 0 ? "now" : `-${back >= 60_000 ? `${back / 60_000}m` : `${back / 1000}s`}`, x(t), height - PAD.bottom + 6);
    }
  }
  g.save();
  g.beginPath();
  g.rect(PAD.left, PAD.top, plotW, plotH);
  g.clip();
  for (const line of lines) {
    g.strokeStyle = line.colour;
    g.lineWidth = line.width ?? 2;
    g.setLineDash(line.dash ?? []);
    g.beginPath();
    const alone = [];  // points with a gap on each side: drawn as dots, a line would not show
    let run = 0;
    let previous = null;
    for (const [t, v] of line.points) {
      if (t < from - 5000) continue;
      if (v === null || v === undefined) {  // no value there: a gap
        if (run === 1) alone.push(previous);
        run = 0;
        continue;
      }
      if (run) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      run += 1;
      previous = [t, v];
    }
    if (run === 1) alone.push(previous);
    g.stroke();
    g.setLineDash([]);
    g.fillStyle = line.colour;
    for (const [t, v] of alone) {
      g.beginPath();
      g.arc(x(t), y(v), 2.5, 0, 2 * Math.PI);
      g.fill();
    }
  }
  for (const dot of dots) {
    if (dot.t < from) continue;
    g.fillStyle = dot.colour;
    g.beginPath();
    g.arc(x(dot.t), y(dot.v), 3, 0, 2 * Math.PI);
    g.fill();
  }
  drawMarkers(g, markers.filter((m) => m.t >= from && m.t <= to)
    .map((m) => ({...m, at: Math.round(x(m.t)) + 0.5})).sort((p, q) => p.at - q.at),
  {left: PAD.left, right: PAD.left + plotW, top: PAD.top, bottom: PAD.top + plotH});
  g.restore();
  return {left: PAD.left, right: PAD.left + plotW, top: PAD.top, bottom: PAD.top + plotH,
    time: (px) => from + ((px - PAD.left) / plotW) * (to - from)};
}
