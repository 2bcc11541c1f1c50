// The overview on a narrow screen (a phone): one card per agent — name, trading state, what
// it is doing or why it is not running, pending work, Stop (and Resume while halted or held)
// — instead of a wide table.
// Cards are kept by agent and updated in place (the focus on a Stop button survives).

import {attention, badgeState, reasonsText} from "../blocked.js";
import {h, setAttr, setState, setText, stateBadge} from "../dom.js";
import {num} from "../format.js";
import {resumeButton} from "../halted.js";

/** The media query under which the overview shows cards (panel.css hides the table). */
export const NARROW = "(max-width: 40rem)";

/** What an agent is doing, or why it is not running (the table's words); and how bad it is. */
export function activity(a) {
  const level = attention(a);
  return [reasonsText(a), level === "critical" ? "bad" : level === "warning" ? "warn" : ""];
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
    li._parts = {badge: li.querySelector(".state"), why: li.querySelector(".card-why"), facts: li.querySelector(".card-facts"),
      act: li.querySelector(".card-act"), resume: null};
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
      setState(p.badge, badgeState(a));
      setAttr(p.badge, "data-attention", attention(a));
      if (p.act && (a.trading === "HALTED" || Boolean(a.held)) !== Boolean(p.resume)) {  // as the table's rows
        if (p.resume) {
          p.resume.remove();
          p.resume = null;
        } else {
          p.act.append(p.resume = resumeButton(ctx, a.agentId, {small: true}));
        }
      }
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
