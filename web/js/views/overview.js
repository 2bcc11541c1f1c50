// Overview: every agent as a row — trading state, why it is blocked, mode, queue, active run,
// counters, budget use — sortable (by default: those needing attention first), filterable,
// virtualised, with live durations; a halted row has its own Resume.

import {attention, BADGES, badgeState, RANK, reasonsOf, reasonsText} from "../blocked.js";
import {h, replace, setAttr, setState, setText, stateBadge} from "../dom.js";
import {resumeButton} from "../halted.js";
import {budget, duration, hms, num} from "../format.js";
import {Model} from "../model.js";
import {VirtualTable} from "../virtual.js";
import {NARROW, createCards} from "./cards.js";

const SEVERITY = {HALTED: 0, REDUCING: 1, ACTIVE: 2};
const age = (a) => (a.oldestPendingAgeMs === null ? -1 : a.oldestPendingAgeMs + Model.elapsed(a));
const runFor = (a) => (a.activeRun ? a.activeRun.durationMs + Model.elapsed(a) : -1);
const cooldown = (a) => Math.max(0, a.cooldownRemainingMs - Model.elapsed(a));

const COLUMNS = [
  {key: "agent", label: "Agent", sort: (a) => a.agentId},
  {key: "trading", label: "Trading", sort: (a) => SEVERITY[a.trading] ?? 3},
  {key: "why", label: "Why / doing", sort: (a) => RANK[attention(a)] ?? 2},
  {key: "mode", label: "Mode", sort: (a) => a.mode},
  {key: "pending", label: "Pending", sort: (a) => a.pending, num: true},
  {key: "oldest", label: "Oldest pending", sort: age, num: true},
  {key: "run", label: "Active run", sort: runFor},
  {key: "aborts", label: "Aborts", sort: (a) => a.counters.aborts, num: true},
  {key: "drops", label: "Drops", sort: (a) => a.counters.drops, num: true},
  {key: "dedupes", label: "Dedupes", sort: (a) => a.counters.dedupes, num: true},
  {key: "suppressions", label: "Budget suppr.", sort: (a) => a.counters.suppressions, num: true},
  {key: "hour", label: "Runs / hour", sort: (a) => a.runsLastHour, num: true},
  {key: "day", label: "Runs / day", sort: (a) => a.runsLastDay, num: true},
  {key: "cooldown", label: "Cooldown", sort: cooldown, num: true},
];

export function createOverview(ctx) {
  const section = document.getElementById("overview-view");
  const sort = {key: "why", dir: 1};  // attention first; then by agent id
  const summary = h("p", {class: "summary live", "aria-live": "off"});
  const filter = h("input", {type: "search", id: "agent-filter", placeholder: "agent id…", "aria-controls": "agents-table"});
  const state = h("select", {id: "state-filter", "aria-controls": "agents-table"},
    h("option", {value: ""}, "all states"), ...["ACTIVE", "REDUCING", "HALTED"].map((s) => h("option", {value: s}, s)));
  const busy = h("input", {type: "checkbox", id: "pending-filter"});
  const heads = COLUMNS.map((c) => {
    const button = h("button", {type: "button", class: "sort", text: c.label,
      onclick: () => {
        sort.dir = sort.key === c.key ? -sort.dir : (c.num ? -1 : 1);
        sort.key = c.key;
        render();
      }});
    return h("th", {scope: "col", class: c.num ? "num" : null, "data-col": c.key}, button);
  });
  if (ctx.controls) heads.push(h("th", {scope: "col", class: "act"}, "Actions"));
  const table = h("table", {id: "agents-table", "aria-label": "Agents", "aria-rowcount": 1},
    h("thead", {}, h("tr", {"aria-rowindex": 1}, heads)), h("tbody"));
  const scroller = h("div", {class: "scroller tall live", id: "agents-scroller"}, table);
  const empty = h("p", {class: "muted", hidden: true}, "No agent matches the filters.");
  const cards = createCards(ctx);  // a phone: cards instead of the table (panel.css)
  const narrow = window.matchMedia(NARROW);
  narrow.addEventListener("change", () => render());
  replace(section,
    h("h2", {id: "overview-title"}, "Overview"), summary,
    h("div", {class: "toolbar", role: "search", "aria-label": "Filter agents"},
      h("label", {for: "agent-filter"}, "Filter"), filter,
      h("label", {for: "state-filter"}, "State"), state,
      h("label", {}, busy, "only agents with pending work")),
    scroller, cards.el, empty);
  for (const input of [filter, state, busy]) input.addEventListener("input", () => { scroller.scrollTop = 0; render(); });

  const virtual = new VirtualTable({
    scroller, tbody: table.tBodies[0], columns: heads.length, key: (a) => a.agentId,
    create: (a) => row(a), update: fill,
  });

  function row(a) {
    const cells = {};
    const tr = h("tr", {"data-agent": a.agentId});
    for (const c of COLUMNS) {
      const td = h("td", {class: c.num ? "num" : null, "data-col": c.key});
      cells[c.key] = td;
      tr.append(td);
    }
    cells.agent.append(h("a", {href: `#/agent/${encodeURIComponent(a.agentId)}`, text: a.agentId}));
    cells.trading.append(cells.badge = stateBadge(a.trading));
    cells.why.append(cells.whyText = h("span", {class: "why-text"}));
    cells.runText = h("span");
    cells.runTag = h("span", {class: "tag"});
    cells.run.append(cells.runText, " ", cells.runTag);
    if (ctx.controls) {
      tr.append(h("td", {class: "act"}, h("div", {class: "actions"},
        ctx.controls.button(a.agentId, "emergency_stop", null, {small: true, label: "Stop"}))));
    }
    tr._cells = cells;
    return tr;
  }

  function fill(tr, a, index) {
    const c = tr._cells;
    setAttr(tr, "aria-rowindex", index + 2);
    const level = attention(a);
    const cls = a.trading === "HALTED" ? "halted" : a.trading === "REDUCING" ? "reducing"
      : level === "critical" || level === "warning" ? `attention-${level}` : "";
    if (tr.className !== cls) tr.className = cls;
    setAttr(tr, "data-attention", level);
    const badge = badgeState(a);
    setState(c.badge, badge);
    setAttr(c.badge, "data-attention", level);
    setAttr(c.badge, "title", badge === a.trading ? null : `trading state ${a.trading}`);
    const why = reasonsText(a);
    setText(c.whyText, why);
    setAttr(c.why, "title", reasonsText(a, false));
    // Resume next to the reason, only while HALTED or held (a control that does something there).
    if (ctx.controls && (a.trading === "HALTED" || Boolean(a.held)) !== Boolean(c.resume)) {
      if (c.resume) {
        c.resume.remove();
        c.resume = null;
      } else {
        c.why.prepend(c.resume = resumeButton(ctx, a.agentId, {small: true}));
      }
    }
    setText(c.mode, a.mode);
    setText(c.pending, num(a.pending));
    setText(c.oldest, a.oldestPendingAgeMs === null ? "–" : duration(age(a)));
    setText(c.runText, a.activeRun ? `${a.activeRun.runId} · ${duration(runFor(a))}` : "idle");
    const reasons = reasonsOf(a);
    const capped = reasons.find((r) => r.kind === "suppressed");
    const cooling = reasons.find((r) => r.kind === "cooldown" && r.suppressing);
    const tag = a.held ? ["held", "tag bad", `runs held until resume: ${a.held}`]
      : capped ? ["suppressed", "tag warn", `runs suppressed by a budget until ${hms(capped.until)}`]
      : cooling ? ["cooldown", "tag", `runs wait for the no-trade cooldown until ${hms(cooling.until)}`]
      : ["", "tag", null];
    setText(c.runTag, tag[0]);
    setAttr(c.runTag, "class", tag[1]);
    setAttr(c.runTag, "title", tag[2]);
    c.runTag.hidden = !tag[0];
    setText(c.aborts, num(a.counters.aborts));
    setText(c.drops, num(a.counters.drops));
    setText(c.dedupes, num(a.counters.dedupes));
    setText(c.suppressions, num(a.counters.suppressions));
    setText(c.hour, budget(a.runsLastHour, a.budgets?.maxRunsPerHour));
    setText(c.day, budget(a.runsLastDay, a.budgets?.maxRunsPerDay));
    setText(c.cooldown, cooldown(a) ? duration(cooldown(a)) : "–");
  }

  function items() {
    const text = filter.value.trim().toLowerCase();
    const wanted = state.value;
    const column = COLUMNS.find((c) => c.key === sort.key);
    const list = [...ctx.model.agents.values()].filter((a) => (!text || a.agentId.toLowerCase().includes(text))
      && (!wanted || a.trading === wanted) && (!busy.checked || a.pending > 0 || a.activeRun));
    return list.sort((x, y) => {
      const a = column.sort(x);
      const b = column.sort(y);
      return (a < b ? -1 : a > b ? 1 : 0) * sort.dir || (x.agentId < y.agentId ? -1 : 1);
    });
  }

  function render() {
    const list = items();
    const agents = ctx.model.agents;
    // Counted by the badge each row wears: an ACTIVE agent that waits or is suppressed is
    // not counted active.
    const counts = Object.fromEntries(BADGES.map((b) => [b, 0]));
    let pending = 0;
    for (const a of agents.values()) {
      counts[badgeState(a)] += 1;
      pending += a.pending;
    }
    const states = BADGES.filter((b) => counts[b] || ["ACTIVE", "REDUCING", "HALTED"].includes(b))
      .map((b) => `${counts[b]} ${b.toLowerCase()}`);
    const rate = ctx.model.charts.rate.get(Math.floor(ctx.model.serverNow() / 1000) - 1) || 0;
    setText(summary, `${agents.size} agents · ${states.join(" · ")} · `
      + `${num(pending)} pending · log position ${num(ctx.model.position)} · ${num(rate)} events/s`);
    summary.dataset.position = ctx.model.position;
    for (const th of heads.slice(0, COLUMNS.length)) {
      setAttr(th, "aria-sort", th.dataset.col === sort.key ? (sort.dir > 0 ? "ascending" : "descending") : null);
    }
    setAttr(table, "aria-rowcount", list.length + 1);
    empty.hidden = list.length > 0 || agents.size === 0;
    if (narrow.matches) {
      cards.render(list);
      return;
    }
    virtual.setItems(list);
    virtual.render();
  }

  return {
    section,
    title: "Overview",
    show(params = {}) {
      if (params.state !== undefined && params.state !== state.value) {  // e.g. the halted banner's link
        state.value = ["ACTIVE", "REDUCING", "HALTED"].includes(params.state) ? params.state : "";
        scroller.scrollTop = 0;
      }
      render();
    },
    change(detail) { if (detail.agents || detail.events.length) render(); },
    tick() { render(); },
  };
}
