// The overview on a narrow screen (a phone): one card per agent — name, trading state, what
// it is doing or why it is not running, pending work, and Stop — instead of a wide table.
// Cards are kept by agent and updated in place (the focus on a Stop button survives).

import {h, setAttr, setState, setText, stateBadge} from "../dom.js";
import {clock, duration, num} from "../format.js";
import {Model} from "../model.js";

/** The media query under which the overview shows cards (panel.css hides the table). */
export const NARROW = "(max-width: 40rem)";

/** What an agent is doing, or why it is not running, in a few words; and how bad it is. */
export function activity(a) {
  const cooldown = Math.max(0, a.cooldownRemainingMs - Model.elapsed(a));
  if (a.trading === "HALTED") return ["halted: no run starts until resume", "bad"];
  if (a.held) return [`held until resume: ${a.held}`, "bad"];
  if (a.activeRun) return [`running ${a.activeRun.runId} for ${duration(a.activeRun.durationMs + Model.elapsed(a))}`, ""];
  if (a.suppressedUntil) return [`suppressed by budget until ${clock(a.suppressedUntil).slice(0, 8)}`, "warn"];
  if (cooldown) return [`cooldown ${duration(cooldown)}`, "warn"];
  return [a.pending ? "waiting to run" : "idle", ""];
}

export function createCards(ctx) {
  const list = h("ul", {class: "agent-cards live", id: "agent-cards", "aria-label": "Agents"});
  const cards = new Map();

  function card(a) {
    const name = h("a", {href: `#/agent/${encodeURIComponent(a.agentId)}`, class: "card-name", text: a.agentId});
    const li = h("li", {class: "agent-card", "data-agent": a.agentId},
      h("div", {class: "card-top"}, name, stateBadge(a.trading)),
      h("p", {class: "card-why"}), h("p", {class: "card-facts muted"}),
      ctx.controls ? h("div", {class: "card-act"},
        ctx.controls.button(a.agentId, "emergency_stop", null, {small: true, label: "Stop"})) : null);
    li._parts = {badge: li.querySelector(".state"), why: li.querySelector(".card-why"), facts: li.querySelector(".card-facts")};
    return li;
  }

  /** Show these agents, in this order. */
  function render(agents) {
    const keep = new Set();
    let before = null;
    for (const a of agents) {
      let li = cards.get(a.agentId);
      if (!li) {
        li = card(a);
        cards.set(a.agentId, li);
      }
      keep.add(a.agentId);
      const p = li._parts;
      setState(p.badge, a.trading);
      const [why, level] = activity(a);
      setText(p.why, why);
      setAttr(p.why, "class", `card-why ${level}`.trim());
      setAttr(li, "class", `agent-card ${a.trading === "HALTED" ? "halted" : a.trading === "REDUCING" ? "reducing" : ""}`.trim());
      setText(p.facts, `${a.mode} · ${num(a.pending)} pending · ${num(a.runsLastHour)} runs this hour`);
      const at = before ? before.nextSibling : list.firstChild;
      if (at !== li) list.insertBefore(li, at);
      before = li;
    }
    for (const [id, li] of cards) {
      if (!keep.has(id)) {
        li.remove();
        cards.delete(id);
      }
    }
  }

  return {el: list, render};
}
