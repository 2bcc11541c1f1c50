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

/** The name of the zone every time of the panel is shown in (the browser's): "UTC", "GMT+1". */
export const ZONE = new Intl.DateTimeFormat("en", {timeZoneName: "short"}).formatToParts(new Date())
  .find((part) => part.type === "timeZoneName")?.value ?? "local time";

const pad = (n, w = 2) => String(n).padStart(w, "0");

/** "14:05:00.250" (24-hour, local) with no zone: for axes and columns whose heading names it. */
export function bareClock(epochMs) {
  if (!epochMs) return "–";
  const d = new Date(epochMs);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** Local wall-clock time with milliseconds and the zone: "14:05:00.250 UTC". */
export function clock(epochMs) {
  return epochMs ? `${bareClock(epochMs)} ${ZONE}` : "–";
}

/** Local time to the second with the zone: "14:05:00 UTC" (an ISO string or ms). */
export function hms(at) {
  const ms = typeof at === "string" ? Date.parse(at) : at;
  return ms ? `${bareClock(ms).slice(0, 8)} ${ZONE}` : "–";
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
  const trade = describeOrder(type, d);
  if (trade !== null) return trade;
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

// Orders and broker reports, and times for people (runs, charts and the event log).

const QTY = new Intl.NumberFormat("en", {maximumFractionDigits: 8});

/** "BUY 0.5 BTCUSD @ 64,000.00" (or "@ market") for an order intent (either case of keys). */
export function orderText(intent) {
  const i = intent || {};
  const limit = i.limitPrice ?? i.limit_price;
  return `${String(i.side ?? "?").toUpperCase()} ${QTY.format(i.qty ?? 0)} ${i.symbol ?? "?"} @ ${limit ? price(limit, i.symbol) : "market"}`;
}

/** One line for an order or broker event, or null for other types. */
export function describeOrder(type, d) {
  const order = {orderId: d.order_id};
  const qty = (q, p) => `${QTY.format(q ?? 0)}${p === null || p === undefined ? "" : ` @ ${price(p, order)}`}`;
  switch (type) {
    case "OrderAccepted": return `${orderText(d.intent)} accepted (${d.order_id})`;
    case "OrderRejected": return `${orderText(d.intent)} rejected: ${d.reason}`;
    case "OrderCancelRequested": return `cancel ${d.order_id} requested (${d.by})`;
    case "OrderFilled": return `fill ${qty(d.qty, d.price)} (${d.order_id})`;
    case "OrderClosed": return `${d.order_id} ${d.status}${d.reason ? `: ${d.reason}` : ""}`;
    case "BrokerReportIgnored": return `report on ${d.order_id} ignored: ${d.reason}`;
    case "BrokerReport":
      if (d.status === "filled" || d.status === "partially_filled") {
        return `${d.status === "filled" ? "fill" : "partial fill"} ${qty(d.filled_qty, d.price)} (${d.order_id})`;
      }
      return `${d.order_id} ${d.status}${d.reason ? `: ${d.reason}` : ""}`;
    case "RunFinished": {
      const orders = d.orders || [];
      return `${d.run_id} finished: ${String(d.outcome).replace("_", " ")}${orders.length ? ` · ${orders.map(orderText).join(", ")}` : ""}`;
    }
    default: return null;
  }
}

const DAY_MS = 86_400_000;

/** How long ago, in words: "12 s ago", "3 min ago", "2 h ago", "4 d ago" ("in 5 s" ahead). */
export function age(epochMs, now = Date.now()) {
  const ms = now - epochMs;
  const v = Math.abs(ms);
  const words = v < 1000 ? "now" : v < 60_000 ? `${Math.floor(v / 1000)} s` : v < 3_600_000 ? `${Math.floor(v / 60_000)} min`
    : v < DAY_MS ? `${Math.floor(v / 3_600_000)} h` : `${Math.floor(v / DAY_MS)} d`;
  return words === "now" ? "just now" : ms >= 0 ? `${words} ago` : `in ${words}`;
}

/** The date of a time and a space when it is not today ("26 Nov ", "3 Jan 2025 "), else "". */
function dayOf(ms, now) {
  const d = new Date(ms);
  if (d.toDateString() === new Date(now).toDateString()) return "";
  return `${d.toLocaleDateString("en-GB", {day: "numeric", month: "short",
    year: d.getFullYear() === new Date(now).getFullYear() ? undefined : "numeric"})} `;
}

/** Local time with its zone, and the date when it is not today: "14:03:05 UTC" or
 * "26 Nov 14:03:05 UTC" (24-hour, as every time of the panel). */
export function when(epochMs, now = Date.now()) {
  if (!epochMs) return "–";
  const ms = typeof epochMs === "string" ? Date.parse(epochMs) : epochMs;
  return `${dayOf(ms, now)}${hms(ms)}`;
}

/** A stretch of time with its zone once: "14:03:00–14:03:30 UTC" (the date first when not today). */
export function between(fromMs, toMs, now = Date.now()) {
  return `${dayOf(fromMs, now)}${bareClock(fromMs).slice(0, 8)}–${hms(toMs)}`;
}

/** A time in full, for tooltips: "29 Nov 2026 14:03:05.250 UTC". */
export function stamp(epochMs) {
  return `${new Date(epochMs).toLocaleDateString("en-GB", {day: "numeric", month: "short", year: "numeric"})} ${clock(epochMs)}`;
}

// Prices by the symbol's tick (GET /api/market): each shown with the tick's decimals,
// rounded to a whole number of ticks.

const market = {tick: 0.01, ticks: new Map(), orders: new Map()};

/** The ticks of GET /api/market: `{tick, ticks: {symbol: tick}}`. */
export function setTicks(answer) {
  market.tick = answer.tick;
  market.ticks = new Map(Object.entries(answer.ticks));
}

/** Remember an order's symbol (events about it name the order only). */
export function rememberOrder(orderId, symbol) {
  if (!orderId || !symbol) return;
  market.orders.set(orderId, symbol);
  if (market.orders.size > 50_000) market.orders.delete(market.orders.keys().next().value);
}

/** The tick of a symbol (or of the symbol of an order: `{orderId}`). */
export function tickOf(symbol) {
  const name = typeof symbol === "object" && symbol !== null ? market.orders.get(symbol.orderId) : symbol;
  return market.ticks.get(name) ?? market.tick;
}

const FORMATS = new Map();

/** The decimals of a tick, as the server words prices: 2 for 0.01 and 0.25, 1 for 0.5, 0 for 5. */
function tickDecimals(tick) {
  const [mantissa, exponent] = String(tick).split("e-");
  return Math.min(12, (mantissa.split(".")[1] || "").length + Number(exponent || 0));
}

/** A price rounded to the symbol's tick, with as many decimals as the tick has: "64,012.50". */
export function price(value, symbol) {
  if (value === null || value === undefined) return "–";
  const tick = tickOf(symbol);
  const decimals = tickDecimals(tick);
  let format = FORMATS.get(decimals);
  if (!format) FORMATS.set(decimals, format = new Intl.NumberFormat("en", {minimumFractionDigits: decimals, maximumFractionDigits: decimals}));
  return format.format(Math.round(value / tick) * tick);
}
