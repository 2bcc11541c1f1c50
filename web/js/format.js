// Formatting of times, durations, numbers and one-line event descriptions.

/** "850 ms", "12.3 s", "4m 05s", "2h 03m"; "–" for null. */
export function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  const value = Math.max(0, ms);
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60_000) return `${(value / 1000).toFixed(1)} s`;
  const seconds = Math.floor(value / 1000);
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${String(seconds % 60).padStart(2, "0")}s`;
  return `${Math.floor(seconds / 3600)}h ${String(Math.floor(seconds / 60) % 60).padStart(2, "0")}m`;
}

/** Local wall-clock time with milliseconds. */
export function clock(epochMs) {
  if (!epochMs) return "–";
  const d = new Date(epochMs);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

const COUNT = new Intl.NumberFormat("en");

/** A count with thousands separators. */
export function num(n) {
  return n === null || n === undefined ? "–" : COUNT.format(n);
}

/** "3 / 60" for a budget use against its limit ("3 / –" without a limit). */
export function budget(used, limit) {
  return `${used} / ${limit ?? "∞"}`;
}

function field(data, ...names) {
  for (const name of names) if (data && data[name] !== undefined && data[name] !== null) return data[name];
  return undefined;
}

/** One line saying what an event is about (the full data is in the detail view). */
export function describe(type, data) {
  const d = data || {};
  const id = field(d, "request_id", "requestId");
  const run = field(d, "run_id", "runId");
  switch (type) {
    case "RequestReceived": {
      const r = d.request || {};
      const payload = r.payload || {};
      const what = payload.action ? `action=${payload.action}` : payload.message ? `“${payload.message}”`
        : payload.code ? `code=${payload.code}` : r.dedupeKey ? `key=${r.dedupeKey}` : "";
      return `${r.kind} ${r.requestId} ${r.priority} ${what}${d.principal ? ` by ${d.principal}` : ""}`;
    }
    case "RequestQueued": return `${id} queued (${d.mode})`;
    case "RequestDeduped": return `${id} duplicate of ${d.duplicate_of} (key ${d.key})`;
    case "RequestRepeated": return `${id} repeated; first decision ${d.first_decision}`;
    case "RequestRejected": case "RequestDropped": case "RequestSummarized":
      return `${id}: ${d.reason}`;
    case "FallbackApplied": return `${id} → followup: ${d.reason}`;
    case "ControlApplied": return `${d.action}: ${d.from_state} → ${d.to_state}`;
    case "RunStarted": return `${run} with ${(d.request_ids || []).length} request(s)`;
    case "RunSteered": return `${d.request_id} steered into ${run}`;
    case "RunCompleted": return `${run} ${d.outcome}`;
    case "RunFailed": return `${run} failed: ${d.error}`;
    case "RunAborted": return `${run} aborted (${d.reason})${d.by ? ` by ${d.by}` : ""}${d.requeued ? ", requeued" : ""}`;
    case "RunFinished": return `${run} finished: ${d.outcome}`;
    case "RunsSuppressed": return `${d.reason}: ${d.detail}`;
    case "RunsHeld": return `held (${d.provider}): ${d.reason}`;
    case "OperatorCommand": return `${d.action}${run ? ` ${run}` : ""} by ${d.principal}`;
    case "OperatorApplied": case "OperatorRejected":
      return `${d.action} by ${d.principal}${d.detail ? `: ${d.detail}` : ""}${d.reason ? `: ${d.reason}` : ""}`;
    case "TimerElapsed": return "timer";
    case "RunSteerability": case "SteerabilityChanged": return `${run} ${d.steerable ? "can" : "cannot"} take steers`;
    case "ConfigChanged": case "ConfigApplied":
      return `mode ${d.config?.mode}, cap ${d.config?.cap}, drop ${d.config?.dropPolicy}${d.principal ? ` by ${d.principal}` : ""}`;
    case "SlotRequested": case "SlotQueued":
      return `${d.agent_id} ${d.run_id} asks for a slot (${d.priority}, ~${d.input_tokens}+${d.output_tokens} tokens)`;
    case "SlotGranted": return `${d.slot_id} granted${d.probe ? " (probe)" : ""}`;
    case "SlotReleased": return `${d.slot_id} released: ${d.outcome}`;
    case "SlotFreed": return `${d.slot_id} freed: ${d.detail}`;
    case "SlotRefused": return `${d.agent_id} ${d.run_id} refused (${d.code}): ${d.reason}`;
    case "BackoffScheduled": return `backoff #${d.attempt} until ${clock(d.until)}: ${d.reason}`;
    case "BreakerOpened": return `breaker open until ${clock(d.until)}: ${d.reason}`;
    default: {
      const text = JSON.stringify(d);
      return text.length > 140 ? `${text.slice(0, 140)}…` : text;
    }
  }
}

/** Event types that mean trouble, and those of the control lane (for colour in lists). */
export const BAD_TYPES = new Set(["RunAborted", "RunFailed", "RequestDropped", "RequestRejected",
  "RunsSuppressed", "RunsHeld", "SlotRefused", "BreakerOpened", "BackoffScheduled", "OperatorRejected",
  "OrderRejected", "AgentCallRejected", "SpendLimitReached"]);
export const CONTROL_TYPES = new Set(["ControlApplied", "OperatorApplied", "OperatorCommand", "RunsUnheld"]);
