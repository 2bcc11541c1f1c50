// The panel's live model of the gateway: every agent's status, the provider gates, the recent
// event log and the series behind the charts. Fed by the connection's snapshot and event
// frames. Status is never folded here (the domain's fold lives in the gateway): when an
// agent's events arrive its status is re-read over HTTP, batched, a few times a second at
// most; only unmistakable facts (a trading state change, a run ending) are applied at once.
// Views hear of changes once per animation frame, with the new events of that frame.

import {describe, rememberOrder} from "./format.js";

const LOG_CAPACITY = 20_000;
const REFRESH_MS = 250;
const FULL_REFRESH_MS = 5_000;
const SERIES_MS = 10 * 60_000;
const FEW = 4;

/** Per-second event counts, queue depth samples and finished runs, for the charts. */
export class Series {
  constructor() {
    this.rate = new Map();   // second (server time) -> events recorded in it
    this.depth = [];         // [t, total pending, largest pending]
    this.runs = [];          // {t, ms, outcome, agent}
    this.starts = new Map(); // "stream/runId" -> recordedAt of RunStarted
  }

  add(entry) {
    const second = Math.floor(entry.recordedAt / 1000);
    this.rate.set(second, (this.rate.get(second) || 0) + 1);
    const d = entry.data;
    if (entry.type === "RunStarted") {
      this.starts.set(`${entry.stream}/${d.run_id}`, entry.recordedAt);
    } else if (entry.type === "RunCompleted" || entry.type === "RunFailed" || entry.type === "RunAborted") {
      const key = `${entry.stream}/${d.run_id}`;
      const start = this.starts.get(key);
      if (start !== undefined) {
        this.starts.delete(key);
        const outcome = entry.type === "RunCompleted" ? d.outcome : entry.type === "RunFailed" ? "failed" : "aborted";
        this.runs.push({t: entry.recordedAt, ms: entry.recordedAt - start, outcome, agent: entry.stream});
      }
    }
  }

  sample(t, agents) {
    let total = 0;
    let largest = 0;
    for (const a of agents.values()) {
      total += a.pending;
      largest = Math.max(largest, a.pending);
    }
    this.depth.push([t, total, largest]);
  }

  trim(now) {
    const oldest = now - SERIES_MS;
    for (const second of this.rate.keys()) if (second * 1000 < oldest) this.rate.delete(second);
    while (this.depth.length && this.depth[0][0] < oldest) this.depth.shift();
    while (this.runs.length && this.runs[0].t < oldest) this.runs.shift();
    if (this.starts.size > 10_000) this.starts.clear();
  }
}

export class Model extends EventTarget {
  constructor(api) {
    super();
    this.api = api;
    this.agents = new Map();      // agentId -> status (GET /api/agents shape) + _at (Date.now() when read)
    this.providers = new Map();   // name -> status (GET /api/providers shape) + _at
    this.events = [];             // the recent log, oldest first
    this.inputs = new Set();      // names of input event types (agents' and gates')
    this.kinds = new Map();       // requestId -> request kind
    this.types = new Set();       // every event type seen
    this.snapshotPosition = 0;
    this.position = 0;
    this.clockOffset = null;      // server clock minus ours, estimated from live events
    this.charts = new Series();
    this.dirty = new Set();
    this.providersDirty = false;
    this.fullDue = false;
    this.lastRefresh = 0;
    this.refreshTimer = null;
    this.refreshing = false;
    this.fresh = [];
    this.flags = {agents: false, providers: false, reset: false, pnl: false};
    this.frame = null;
    this.pnl = null;              // the P&L of the subscription's pnl frames (GET /api/pnl shape) + _at
    this.slots = new Map();       // a provider gate's slot id -> the agent it is for
  }

  /** A pnl frame: the P&L of every agent followed, as it changed. */
  applyPnl(view) {
    this.pnl = {...view, _at: Date.now()};
    this._changed({pnl: true});
  }

  /** Which event types are inputs (and check the token can read at all). */
  async loadTypes() {
    const types = await this.api.get("/api/event-types");
    for (const family of Object.values(types)) for (const name of family.inputs) this.inputs.add(name);
  }

  start() {
    this.ticker = setInterval(() => {
      this.charts.sample(this.serverNow(), this.agents);
      this.charts.trim(this.serverNow());
    }, 1000);
    // Budget windows and gate windows move with time alone: read everything now and then.
    this.fullTicker = setInterval(() => { this.fullDue = true; this.scheduleRefresh(); }, FULL_REFRESH_MS);
  }

  stop() {
    clearInterval(this.ticker);
    clearInterval(this.fullTicker);
    clearTimeout(this.refreshTimer);
  }

  serverNow() { return Date.now() + (this.clockOffset ?? 0); }

  /** Milliseconds since a status was read (to advance its durations and ages). */
  static elapsed(status) { return Math.max(0, Date.now() - status._at); }

  applySnapshot(frame) {
    const at = Date.now();
    this.agents = new Map(frame.agents.map((a) => [a.agentId, {...a, _at: at}]));
    if (frame.providers.length) {  // empty when not following the gates (an agent-scoped token)
      this.providers = new Map(frame.providers.map((p) => [p.name, {...p, _at: at}]));
    }
    this.snapshotPosition = frame.position;
    this.position = Math.max(this.position, frame.position);
    this.dirty.clear();
    this._changed({agents: true, providers: true});
  }

  /** A log entry from an event frame or an HTTP event ({..., type} instead of eventType). */
  entry(raw) {
    const data = raw.data || {};
    const type = raw.eventType || raw.type;
    const entry = {
      position: raw.position, stream: raw.stream, version: raw.version, type, data,
      recordedAt: raw.recordedAt, input: this.inputs.has(type),
      provider: raw.stream.startsWith("provider:"), kind: null, _summary: null, _search: null,
    };
    if ((type === "OrderAccepted" || type === "ApprovalRequested") && data.intent) rememberOrder(data.order_id, data.intent.symbol);
    if (type === "RequestReceived" && data.request) {
      entry.kind = data.request.kind;
      this.kinds.set(data.request.requestId, data.request.kind);
      if (this.kinds.size > 100_000) this.kinds.delete(this.kinds.keys().next().value);
    } else {
      const id = data.request_id || data.requestId;
      if (id) entry.kind = this.kinds.get(id) || null;
    }
    return entry;
  }

  applyEvent(frame) {
    const entry = this.entry(frame);
    this.types.add(entry.type);
    this.events.push(entry);
    if (this.events.length > LOG_CAPACITY * 1.1) this.events.splice(0, this.events.length - LOG_CAPACITY);
    this.charts.add(entry);
    this.position = Math.max(this.position, frame.position);
    // Events up to the snapshot's position are in its status already: log and charts only.
    if (frame.position > this.snapshotPosition) {
      // An event is recorded before it reaches us: the largest gap seen is the closest
      // estimate of how far the server's clock is ahead of ours (or behind, if negative).
      const gap = frame.recordedAt - Date.now();
      this.clockOffset = this.clockOffset === null ? gap : Math.max(this.clockOffset, gap);
      if (entry.provider) {
        this.providersDirty = true;
        // An agent's wait at the gate is part of its status (why it waits, behind whom,
        // since when): read again the agents this event moves, not at the next full read.
        for (const id of this._atGate(entry)) if (this.agents.has(id)) this.dirty.add(id);
      } else {
        this._applyFact(entry);
        this.dirty.add(entry.stream);
      }
      this.scheduleRefresh();
    }
    this.fresh.push(entry);
    this._changed({});
  }

  /** The agents a provider gate's event concerns: its own, and those waiting there. */
  _atGate(entry) {
    const d = entry.data;
    if (entry.type === "SlotRequested" || entry.type === "SlotQueued") this.slots.set(d.slot_id, d.agent_id);
    const ids = new Set(d.agent_id ? [d.agent_id] : []);
    const owner = this.slots.get(d.slot_id);
    if (owner) ids.add(owner);
    if (entry.type === "SlotFreed" || entry.type === "SlotRefused") this.slots.delete(d.slot_id);
    if (this.slots.size > 10_000) this.slots.delete(this.slots.keys().next().value);
    const gate = this.providers.get(entry.stream.slice("provider:".length));
    for (const w of gate?.waitingAgents ?? []) ids.add(w.agentId);
    return ids;
  }

  /** The facts a person must see at once, before the status is read again. */
  _applyFact(entry) {
    const agent = this.agents.get(entry.stream);
    if (!agent) return;
    const d = entry.data;
    if (entry.type === "ControlApplied" || entry.type === "RunsHeld") {
      agent.trading = d.to_state;
      if (entry.type === "RunsHeld") agent.held = d.reason;
    } else if (entry.type === "RunStarted") {
      agent.activeRun = {runId: d.run_id, requestIds: d.request_ids, startedAt: this.serverNow(),
        durationMs: 0, steers: 0, steerable: false};
      agent._at = Date.now();
    } else if (["RunCompleted", "RunFailed", "RunAborted"].includes(entry.type)) {
      if (agent.activeRun && agent.activeRun.runId === d.run_id) agent.activeRun = null;
    } else {
      return;
    }
    this._changed({agents: true});
  }

  scheduleRefresh() {
    if (this.refreshTimer !== null || this.refreshing) return;
    const wait = Math.max(0, this.lastRefresh + REFRESH_MS - Date.now());
    this.refreshTimer = setTimeout(() => { this.refreshTimer = null; this.refresh(); }, wait);
  }

  /** Re-read the status of agents with new events (one call for a few, one for many). */
  async refresh() {
    if (this.refreshing) return;
    const ids = [...this.dirty];
    const full = this.fullDue || ids.length > FEW;
    const providers = this.providersDirty || (this.fullDue && this.providers.size > 0);
    if (!full && !ids.length && !providers) return;
    this.dirty.clear();
    this.providersDirty = false;
    this.fullDue = false;
    this.refreshing = true;
    const started = Date.now();
    try {
      const jobs = [];
      if (full) {
        jobs.push(this.api.get("/api/agents").then((all) => {
          const at = Date.now();
          this.agents = new Map(all.map((a) => [a.agentId, {...a, _at: at}]));
        }));
      } else {
        for (const id of ids) {
          jobs.push(this.api.get(`/api/agents/${encodeURIComponent(id)}`).then((a) => {
            delete a.config;
            this.agents.set(a.agentId, {...a, _at: Date.now()});
          }));
        }
      }
      if (providers) {
        jobs.push(this.api.get("/api/providers").then((body) => {
          const at = Date.now();
          this.providers = new Map(body.providers.map((p) => [p.name, {...p, _at: at}]));
        }));
      }
      await Promise.all(jobs);
      // A busy gateway answers slowly: ask it less often then (never more than a quarter
      // of the time spent waiting for status).
      this.lastRefresh = Date.now() + Math.max(0, 3 * (Date.now() - started) - REFRESH_MS);
      this._changed({agents: true, providers});
    } catch {
      for (const id of ids) this.dirty.add(id);  // try again, later (the gateway may be away)
      this.lastRefresh = Date.now() + 2000;
    } finally {
      this.refreshing = false;
      if (this.dirty.size || this.providersDirty) this.scheduleRefresh();
    }
  }

  /** The one-line description of an event (cached). */
  static summary(entry) {
    if (entry._summary === null) entry._summary = describe(entry.type, entry.data);
    return entry._summary;
  }

  /** Lower-case text of an event for search (cached). */
  static searchText(entry) {
    if (entry._search === null) {
      entry._search = `${entry.position} ${entry.stream} ${entry.type} ${JSON.stringify(entry.data)}`.toLowerCase();
    }
    return entry._search;
  }

  _changed(flags) {
    if (flags.agents) this.flags.agents = true;
    if (flags.providers) this.flags.providers = true;
    if (flags.pnl) this.flags.pnl = true;
    if (this.fresh.length > LOG_CAPACITY) {
      this.fresh = [];
      this.flags.reset = true;
    }
    if (this.frame === null) this.frame = requestAnimationFrame(() => this._flush());
  }

  _flush() {
    this.frame = null;
    const detail = {...this.flags, events: this.fresh};
    this.fresh = [];
    this.flags = {agents: false, providers: false, reset: false, pnl: false};
    this.dispatchEvent(new CustomEvent("change", {detail}));
  }
}
