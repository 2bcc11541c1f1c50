// A small canvas chart: lines and dots over a time window, axes labelled, colours from the
// page's CSS variables (so it follows light and dark). No library.

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

/**
 * Draw `lines` ({colour, points: [[t, v]]}) and `dots` ({t, v, colour}) between `from` and
 * `to` (ms); `format` labels the y axis.
 */
export function drawChart(canvas, {lines = [], dots = [], from, to, format = String}) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (!width || !height) return;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  let top = 0;
  for (const line of lines) for (const [t, v] of line.points) if (t >= from) top = Math.max(top, v);
  for (const dot of dots) if (dot.t >= from) top = Math.max(top, dot.v);
  top = axisTop(Math.max(top * 1.05, 1));
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
  const step = span > 6 * 60_000 ? 120_000 : span > 2 * 60_000 ? 60_000 : 15_000;
  for (let back = 0; back <= span; back += step) {
    const t = to - back;
    g.fillText(back === 0 ? "now" : `-${back >= 60_000 ? `${back / 60_000}m` : `${back / 1000}s`}`, x(t), height - PAD.bottom + 6);
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
  g.restore();
}
