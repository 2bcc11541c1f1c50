// A small canvas chart: lines and dots over a time window, axes labelled, vertical markers,
// colours from the page's CSS variables (so it follows light and dark). No library.

import {clock} from "./format.js";

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

/** Wall-clock ticks between `from` and `to`, about one per 90 px: [[t, label]]. */
function clockTicks(from, to, width) {
  const span = to - from;
  const step = TICKS.find((s) => span / s <= Math.max(2, width / 90)) ?? TICKS.at(-1);
  const offset = new Date(from).getTimezoneOffset() * 60_000;  // ticks on local round times
  const ticks = [];
  for (let t = Math.ceil((from - offset) / step) * step + offset; t <= to; t += step) {
    const hms = clock(t).slice(0, 8);  // "14:05:00"
    ticks.push([t, step < 60_000 ? hms : step >= 86_400_000 ? new Date(t).toLocaleDateString() : hms.slice(0, 5)]);
  }
  return ticks;
}

/**
 * Draw `lines` ({colour, points: [[t, v]]}) and `dots` ({t, v, colour}) between `from` and
 * `to` (ms); `format` labels the y axis. `axis: "clock"` labels the time axis with local
 * times (default: ages, "-2m" ... "now"); `markers` ({t, colour, label}) are vertical lines
 * across the plot, labelled at its top; `whole` makes the y axis step by whole numbers.
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
    g.lineWidth = 2;
    g.beginPath();
    let started = false;
    for (const [t, v] of line.points) {
      if (t < from - 5000) continue;
      if (started) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      started = true;
    }
    g.stroke();
  }
  for (const dot of dots) {
    if (dot.t < from) continue;
    g.fillStyle = dot.colour;
    g.beginPath();
    g.arc(x(dot.t), y(dot.v), 3, 0, 2 * Math.PI);
    g.fill();
  }
  g.textAlign = "left";
  g.textBaseline = "top";
  for (const marker of markers) {
    if (marker.t < from || marker.t > to) continue;
    const at = Math.round(x(marker.t)) + 0.5;
    g.strokeStyle = marker.colour;
    g.fillStyle = marker.colour;
    g.lineWidth = 2;
    g.setLineDash([5, 3]);
    g.beginPath();
    g.moveTo(at, PAD.top);
    g.lineTo(at, PAD.top + plotH);
    g.stroke();
    g.setLineDash([]);
    if (marker.label) {  // beside the line, on whichever side has room
      const room = g.measureText(marker.label).width + 4 < PAD.left + plotW - at;
      g.textAlign = room ? "left" : "right";
      g.fillText(marker.label, room ? at + 3 : at - 3, PAD.top + 1);
    }
  }
  g.restore();
  return {left: PAD.left, right: PAD.left + plotW, top: PAD.top, bottom: PAD.top + plotH,
    time: (px) => from + ((px - PAD.left) / plotW) * (to - from)};
}
