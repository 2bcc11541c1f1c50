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

/** What a resume of an agent did, in words: {ok, changed, text}. Never throws. */
export async function resumeAgent(ctx, agentId) {
  const result = await ctx.controls.perform(agentId, "resume");
  if (!result.ok || !result.ack) return {ok: false, changed: false, text: result.text};
  const ack = result.ack;
  let from = null;
  let started = null;
  let unheld = false;
  let status = null;
  try {
    const [cause, agent] = await Promise.all([ctx.api.get(`/api/events/${ack.position}`),
      ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}`)]);
    status = agent;
    for (const e of [cause.input, ...cause.decisions]) {
      if (e?.type === "ControlApplied") from = e.data.from_state;
      else if (e?.type === "RunStarted") started = e.data.run_id;
      else if (e?.type === "RunsUnheld") unheld = true;
    }
  } catch {
    return {ok: true, changed: null, text: `${agentId}: resume accepted (position ${ack.position}); its effect could not be read`};
  }
  const repeated = ack.repeated ? " (a repeated request: its first answer)" : "";
  if (from === "ACTIVE" && !unheld) return {ok: true, changed: false, text: `${agentId} was not halted (already ACTIVE): nothing changed${repeated}`};
  if (from === null) return {ok: true, changed: null, text: `${agentId}: resume accepted (position ${ack.position})${repeated}`};
  const parts = [`${agentId} resumed: ${from} → ${status?.trading ?? "ACTIVE"}`];
  if (unheld) parts.push("runs no longer held");
  if (started) parts.push(`run ${started} started`);
  const pending = status?.pending ?? 0;
  const budget = (status?.blocked ?? []).find((r) => r.kind === "suppressed" || r.kind === "cooldown");
  if (pending && budget) {
    parts.push(`${plural(pending, "queued request")} wait for the ${budget.kind === "cooldown" ? "cooldown" : `${budget.budget} budget`} until ${hms(budget.until)}`);
  } else if (pending) {
    parts.push(`${plural(pending, "queued request")} will run`);
  } else if (!started) {
    parts.push("nothing queued");
  }
  return {ok: true, changed: true, text: parts.join(", ") + repeated};
}

/** A Resume button for an agent's row (the row shows it while the agent is HALTED or held). */
export function resumeButton(ctx, agentId, {small = false} = {}) {
  const button = h("button", {type: "button", class: small ? "small" : null, "data-mutating": true,
    "data-action": "resume-halted", "aria-label": `Resume ${agentId}`, text: "Resume"});
  button.addEventListener("click", async () => {
    if (button.getAttribute("aria-busy") === "true") return;
    button.setAttribute("aria-busy", "true");
    button.textContent = "Resuming…";
    try {
      const result = await resumeAgent(ctx, agentId);
      ctx.controls.toast(result.text, result.ok);
    } finally {
      button.removeAttribute("aria-busy");
      button.textContent = "Resume";
    }
  });
  return button;
}

/** Resume every halted agent in `agentIds` after one confirm; one toast says what each did. */
export async function resumeAll(ctx, agentIds) {
  const names = agentIds.length > NAMED ? `${agentIds.slice(0, NAMED).join(", ")} and ${agentIds.length - NAMED} more`
    : agentIds.join(", ");
  const ok = await confirmDialog(`Resume all ${plural(agentIds.length, "halted agent")}?`,
    `${names} go back to ACTIVE: runs start again for their queued requests and new orders are allowed.`,
    "Resume all");
  if (!ok) return null;
  const results = await Promise.all(agentIds.map((id) => resumeAgent(ctx, id)));
  const failed = results.filter((r) => !r.ok).length;
  const head = failed ? `Resume all: ${failed} of ${results.length} failed` : `Resumed ${plural(results.length, "agent")}`;
  ctx.controls.toast(`${head} — ${results.map((r) => r.text).join("; ")}`, !failed);
  return results;
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
