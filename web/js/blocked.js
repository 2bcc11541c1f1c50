// Why an agent is blocked, in words a trader reads at a glance: the `blocked` reasons and the
// `attention` level of an agent's status (see gateway/reads/blocked.py), for the overview rows, the
// agent page and the halted banner.

import {duration, hms} from "./format.js";
import {Model} from "./model.js";

/** Sort rank of an attention level: what needs a look first (info and none alike). */
export const RANK = {critical: 0, warning: 1, info: 2, none: 2};

const LIMITS = {
  rpm: "RPM (requests per minute)", itpm: "input tokens per minute", otpm: "output tokens per minute",
  concurrency: "max concurrent calls", breaker: "circuit breaker open", backoff: "backing off after throttling",
  provider: "provider's own rate limit", fair: "fair share (agents with fewer tokens first)", queue: "next in line",
};
const BUDGETS = {runsPerHour: "runs/hour", runsPerDay: "runs/day"};

/** "14:05:00 UTC" (local, with the zone) of an ISO time; "–" for none. */
export {hms};

/**
 * An agent's reasons, agreeing with its trading state: the model applies a stop or a resume
 * at once, before the status (and its reasons) is read again.
 */
export function reasonsOf(a) {
  const reasons = a.blocked ?? [];
  const halted = reasons.some((r) => r.kind === "halted");
  if (a.trading === "HALTED" && !halted) return [{kind: "halted", by: null, at: null}, ...reasons];
  if (a.trading !== "HALTED" && halted) return reasons.filter((r) => r.kind !== "halted");
  return reasons;
}

/** The attention level of an agent's status (by its trading state where the two disagree). */
export function attention(a) {
  if (a.trading === "HALTED") return "critical";
  if (a.attention && a.attention !== "critical") return a.attention;
  return a.trading === "REDUCING" ? "warning" : "none";
}

/**
 * One reason in words; durations advance with the time since the status was read. `brief`
 * leaves out what a row shows elsewhere (how many requests wait; a refusal's words: the
 * cell's title and the agent page have them).
 */
export function reasonText(r, a, brief = false) {
  const since = (ms) => duration(ms + Model.elapsed(a));
  switch (r.kind) {
    case "halted": return `HALTED${r.by ? ` by ${r.by}` : ""}${r.at ? ` at ${hms(r.at)}` : ""}`;
    case "reducing": return `Paused, reduce-only${r.by ? ` by ${r.by}` : ""}${r.at ? ` at ${hms(r.at)}` : ""}`;
    case "held":  // the reason is "<provider>: <its refusal>", often long: a row names the provider
      return brief ? `Held until resume: ${r.reason.split(":")[0]} refused for spend`
        : `Runs held until resume: ${r.reason}`;
    case "suppressed":
      return `Suppressed by budget (${BUDGETS[r.budget] ?? r.budget}) until ${hms(r.until)}`
        + (r.pending && !brief ? ` · ${r.pending} waiting` : "");
    case "cooldown": return `Cooldown until ${hms(r.until)}${r.suppressing ? " (runs wait)" : ""}`;
    case "gate":
      return `Waiting on provider ${r.provider}: ${LIMITS[r.limit] ?? r.limit}`
        + (r.nextSlotAt ? `, next slot ${hms(r.nextSlotAt)}` : "")
        + `${r.first ? "" : " (behind another agent)"} · ${since(r.forMs)}`;
    case "failed": return `Last run ${r.runId} failed at ${hms(r.at)}: ${r.error}`;
    case "no_worker": return brief ? "No worker connected" : `No worker connected: ${r.detail}`;
    case "running": return `Running ${since(r.forMs)}`;
    default: return r.kind;
  }
}

/**
 * All of an agent's reasons in a line, most severe first ("Idle" / "Idle · N pending" if none);
 * a run waiting at the gate is said once, by the gate. Brief (see `reasonText`) by default.
 */
export function reasonsText(a, brief = true) {
  let reasons = reasonsOf(a);
  if (!reasons.length) return a.pending ? `Idle · ${a.pending} pending` : "Idle";
  if (reasons.some((r) => r.kind === "gate")) reasons = reasons.filter((r) => r.kind !== "running");
  return reasons.map((r) => reasonText(r, a, brief)).join(" · ");
}

/**
 * The badge an agent wears: its trading state, except that an ACTIVE agent that cannot run
 * (runs suppressed by a budget, held, waiting at the provider gate however briefly, waiting
 * for its no-trade cooldown) does not look healthy.
 */
export function badgeState(a) {
  if (a.trading !== "ACTIVE") return a.held && a.trading === "REDUCING" ? "HELD" : a.trading;
  const reasons = reasonsOf(a);
  const kinds = new Set(reasons.map((r) => r.kind));
  if (kinds.has("held")) return "HELD";
  if (kinds.has("suppressed")) return "SUPPRESSED";
  if (kinds.has("gate")) return "WAITING";
  if (reasons.some((r) => r.kind === "cooldown" && r.suppressing)) return "COOLDOWN";
  return "ACTIVE";
}

/** The words of a badge, in the summary line ("3 active · 1 waiting"), in order. */
export const BADGES = ["ACTIVE", "WAITING", "COOLDOWN", "SUPPRESSED", "HELD", "REDUCING", "HALTED"];
