// Charts over time: queue depth, event rate and run durations (each run a dot, by outcome).

import {cssColour, drawChart} from "../chart.js";
import {h, replace, setAttr} from "../dom.js";
import {duration, num} from "../format.js";

function figure(id, title, legend) {
  const canvas = h("canvas", {id, role: "img", "aria-label": title});
  const caption = h("figcaption", {}, h("h3", {}, title),
    h("div", {class: "legend"}, legend.map(([label, colour]) => h("span", {style: `--swatch: var(${colour})`}, label))));
  return {canvas, el: h("figure", {class: "card"}, caption, canvas)};
}

export function createCharts(ctx) {
  const section = document.getElementById("charts-view");
  const range = h("select", {id: "chart-range"},
    h("option", {value: 60_000}, "last minute"), h("option", {value: 300_000, selected: true}, "last 5 minutes"),
    h("option", {value: 600_000}, "last 10 minutes"));
  const depth = figure("chart-depth", "Queue depth", [["all agents", "--accent"], ["largest queue", "--warn"]]);
  const rate = figure("chart-rate", "Event rate (events/s)", [["events committed", "--decision"]]);
  const runs = figure("chart-runs", "Run durations", [["completed", "--good"], ["failed", "--bad"], ["aborted", "--control"]]);
  replace(section, h("h2", {id: "charts-title"}, "Charts"),
    h("div", {class: "toolbar"}, h("label", {for: "chart-range"}, "Window"), range),
    h("div", {class: "charts live"}, depth.el, rate.el, runs.el));
  range.addEventListener("input", draw);

  function draw() {
    const series = ctx.model.charts;
    const to = ctx.model.serverNow();
    const from = to - Number(range.value);
    const depthPoints = series.depth;
    const latest = depthPoints.at(-1) || [0, 0, 0];
    drawChart(depth.canvas, {from, to, format: (v) => num(Math.round(v)), lines: [
      {colour: cssColour("--accent"), points: depthPoints.map(([t, total]) => [t, total])},
      {colour: cssColour("--warn"), points: depthPoints.map(([t, , largest]) => [t, largest])}]});
    setAttr(depth.canvas, "aria-label", `Queue depth: ${latest[1]} pending in all, the largest queue ${latest[2]}`);
    const now = Math.floor(to / 1000);
    const ratePoints = [];
    for (let second = Math.floor(from / 1000); second < now; second++) ratePoints.push([second * 1000, series.rate.get(second) || 0]);
    drawChart(rate.canvas, {from, to, format: (v) => num(Math.round(v)),
      lines: [{colour: cssColour("--decision"), points: ratePoints}]});
    setAttr(rate.canvas, "aria-label", `Event rate: ${ratePoints.at(-1)?.[1] ?? 0} events in the last second`);
    const colours = {failed: cssColour("--bad"), aborted: cssColour("--control")};
    const done = series.runs.filter((r) => r.t >= from);
    drawChart(runs.canvas, {from, to, format: (v) => duration(v),
      dots: done.map((r) => ({t: r.t, v: r.ms, colour: colours[r.outcome] || cssColour("--good")}))});
    const mean = done.length ? done.reduce((sum, r) => sum + r.ms, 0) / done.length : 0;
    setAttr(runs.canvas, "aria-label", `Run durations: ${done.length} runs finished in the window, mean ${duration(mean)}`);
  }

  return {section, title: "Charts", show: draw, change() {}, tick: draw};
}
