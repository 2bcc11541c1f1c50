// The kill switch's way back: a banner "N agents halted" on every view while any agent in
// the token's scope is HALTED (who halted each and when, a link to the halted ones, "Resume
// all" after a confirm), Resume buttons for halted (and held) rows, and acks that say the
// consequence ("alpha resumed: HALTED → ACTIVE, 3 queued requests will run" / "was not
// halted: nothing changed"), read from the log: the decisions the resume's input got, then
// the agent's status.

import {hms} from "./blocked.js";
import {confirmDialog} from "./controls.js";
import {h, setText} from "./dom.js";

const NAMED = 5;

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** The effect of a control as the ack gives it, read from the log instead (the decisions of its input). */
function effectOf(cause) {
  let effect = null;
  for (const e of [cause.input, ...cause.decisions]) {
    if (e?.type === "ControlApplied") effect = {fromState: e.data.from_state, toState: e.data.to_state};
    else if (effect && e?.type === "RunStarted") effect.startedRun = e.data.run_id;
    else if (effect && e?.type === "RunsUnheld") effect.unheld = true;
  }
  if (effect) effect.changed = effect.fromState !== effect.toState || Boolean(effect.startedRun || effect.unheld);
  return effect;
}

/**
 * Resume an agent and say what that did: its state change (the ack's `effect`), whether runs
 * were held, the run it started, and what its queue does now (read after the ack). As
 * `Controls.perform`: {ok, kind, text}; never throws.
 */
export async function resumeAgent(ctx, agentId) {
  const result = await ctx.controls.perform(agentId, "resume");
  if (!result.ok || !result.ack) return result;
  const ack = result.ack;
  let effect = ack.effect ?? null;
  let status = null;
  try {
    const path = `/api/agents/${encodeURIComponent(agentId)}`;
    const [agent, cause] = await Promise.all([ctx.api.get(path),
      effect ? null : ctx.api.get(`/api/events/${ack.position}`)]);  // (a repeat has no effect)
    status = agent;
    effect ??= cause ? effectOf(cause) : null;
  } catch {
    // the ack's effect alone
  }
  const repeated = ack.repeated ? " (a repeated request: its first answer)" : "";
  if (!effect) return {ok: true, kind: "ok", ack, text: `${agentId}: resume accepted (position ${ack.position})${repeated}`};
  if (!effect.changed) {
    return {ok: true, kind: "info", ack, effect,
      text: `${agentId} was not halted (already ${effect.toState}): nothing changed${repeated}`};
  }
  const parts = [`${agentId} resumed: ${effect.fromState} → ${effect.toState}`];
  if (effect.unheld) parts.push("runs no longer held");
  if (effect.startedRun) parts.push(`run ${effect.startedRun} started`);
  const pending = status?.pending ?? 0;
  const budget = (status?.blocked ?? []).find((r) => r.kind === "suppressed" || r.kind === "cooldown");
  if (pending && budget) {
    parts.push(`${plural(pending, "queued request")} wait for the ${budget.kind === "cooldown" ? "cooldown" : `${budget.budget} budget`} until ${hms(budget.until)}`);
  } else if (pending) {
    parts.push(`${plural(pending, "queued request")} will run`);
  } else if (!effect.startedRun && status) {
    parts.push("nothing queued");
  }
  return {ok: true, kind: "ok", ack, effect, text: parts.join(", ") + repeated};
}

/** A Resume button for an agent's row (the row shows it while the agent is HALTED or held). */
export function resumeButton(ctx, agentId, {small = false} = {}) {
  const button = h("button", {type: "button", class: small ? "small" : null, "data-mutating": true,
    "data-action": "resume-halted", "aria-label": `Resume ${agentId}`, text: "Resume"});
  button.addEventListener("click", async () => {
    if (button.getAttribute("aria-busy") === "true") return;
    button.setAttribute("aria-busy", "true");
    try {
      await ctx.controls.track(`Resume ${agentId}`, resumeAgent(ctx, agentId));
    } finally {
      button.removeAttribute("aria-busy");
    }
  });
  return button;
}

/** Resume every halted agent in `agentIds` after one confirm; one notification says what each did. */
export async function resumeAll(ctx, agentIds) {
  const names = agentIds.length > NAMED ? `${agentIds.slice(0, NAMED).join(", ")} and ${agentIds.length - NAMED} more`
    : agentIds.join(", ");
  const ok = await confirmDialog(`Resume all ${plural(agentIds.length, "halted agent")}?`,
    `${names} go back to ACTIVE: runs start again for their queued requests and new orders are allowed.`,
    "Resume all");
  if (!ok) return null;
  const all = Promise.all(agentIds.map((id) => resumeAgent(ctx, id))).then((results) => {
    const failed = results.filter((r) => !r.ok).length;
    const head = failed ? `Resume all: ${failed} of ${results.length} failed` : `Resumed ${plural(results.length, "agent")}`;
    return {ok: !failed, kind: failed ? "bad" : "ok", results, text: `${head} — ${results.map((r) => r.text).join("; ")}`};
  });
  return ctx.controls.track(`Resume of ${plural(agentIds.length, "halted agent")}`, all, null, "their states");
}

/** The banner (an element to put in the page once); it follows the model by itself. */
export function createHaltedBanner(ctx) {
  const count = h("strong", {class: "halted-count"});
  const who = h("span", {class: "halted-who"});
  const show = h("a", {href: "#/overview?state=HALTED", class: "halted-show"}, "Show halted");
  const all = ctx.controls ? h("button", {type: "button", class: "small", id: "resume-all", "data-mutating": true},
    "Resume all") : null;
  const banner = h("div", {id: "halted-banner", class: "halted-banner", role: "status", "aria-live": "polite", hidden: true},
    count, " ", who, " ", show);
  let halted = [];
  all?.addEventListener("click", async () => {
    if (all.getAttribute("aria-busy") === "true" || !halted.length) return;
    all.setAttribute("aria-busy", "true");
    try { await resumeAll(ctx, halted.map((a) => a.agentId)); } finally { all.removeAttribute("aria-busy"); }
  });

  function render() {
    halted = [...ctx.model.agents.values()].filter((a) => a.trading === "HALTED")
      .sort((x, y) => (x.agentId < y.agentId ? -1 : 1));
    banner.hidden = halted.length === 0;
    banner.dataset.count = halted.length;
    if (all && (halted.length > 0) !== all.isConnected) {  // a control only while it does something
      if (halted.length) banner.append(all);
      else all.remove();
    }
    if (!halted.length) return;
    setText(count, `■ ${plural(halted.length, "agent")} halted:`);
    const named = halted.slice(0, NAMED).map((a) => {
      const r = (a.blocked ?? []).find((x) => x.kind === "halted");
      return `${a.agentId}${r?.by ? ` by ${r.by}` : ""}${r?.at ? ` at ${hms(r.at)}` : ""}`;
    });
    setText(who, named.join(", ") + (halted.length > NAMED ? ` and ${halted.length - NAMED} more` : "") + ".");
  }

  ctx.model.addEventListener("change", (event) => { if (event.detail.agents) render(); });
  render();
  return banner;
}
