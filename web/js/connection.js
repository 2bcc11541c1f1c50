// The WebSocket side: authenticate at the handshake (the token as a subprotocol), subscribe
// (resuming from the last position seen; with the P&L frames), and reconnect by itself with
// backoff. Emits "status", "hello", "snapshot", "event" (one per event, also for those that
// came batched in one frame), "pnl", "denied" and "gap" as DOM events on the connection
// object.
//
// Liveness: the gateway sends a heartbeat whenever a subscription had nothing else to send
// for `heartbeatMs` (its hello says how often). A connection that hears nothing for
// STALE_BEATS of them is "stale" (frozen gateway, dead link): said at once, not after the
// socket times out; frames flowing again make it "open" again.

const PING_EVERY_MS = 10_000;
const SILENCE_LIMIT_MS = 25_000;
const STALE_BEATS = 2.5;           // heartbeats missed before the connection is called stale
const STALE_FLOOR_MS = 3_000;
const WATCH_EVERY_MS = 250;
const MAX_CATCH_UP = 20_000;
const PROTOCOL = "gateway.v1";

/** Base64url (RFC 4648 section 5, no padding) of a string's UTF-8 bytes. */
function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export class Connection extends EventTarget {
  /** `backlog`: events to replay from the log before going live on the first subscribe. */
  constructor(token, {backlog = 2000, url = null} = {}) {
    super();
    this.token = token;
    this.backlog = backlog;
    this.url = url || `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/control`;
    this.state = "idle";           // idle | connecting | open | closed
    this.lastPosition = null;      // the position of the last event processed
    this.attempt = 0;
    this.since = null;             // when the connection was lost
    this.nextTry = null;
    this.hello = null;
    this.ws = null;
    this.stopped = false;
    this.timer = null;
    this.lastHeard = 0;
    this.firstAfter = 0;         // where the first subscription started replaying the log
  }

  /** How long a silence makes the connection stale (ms). */
  get staleAfter() {
    const beat = this.hello?.heartbeatMs;
    return beat ? Math.max(STALE_FLOOR_MS, beat * STALE_BEATS) : PING_EVERY_MS * 1.5;
  }

  start() {
    this.stopped = false;
    this._open();
    this.pinger = setInterval(() => this._ping(), PING_EVERY_MS / 2);
    this.watcher = setInterval(() => this._watch(), WATCH_EVERY_MS);
  }

  stop() {
    this.stopped = true;
    clearInterval(this.pinger);
    clearInterval(this.watcher);
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "bye");
    this._status("idle");
  }

  _status(state, detail = {}) {
    this.state = state;
    this.dispatchEvent(new CustomEvent("status", {detail: {state, ...detail}}));
  }

  _emit(name, detail) { this.dispatchEvent(new CustomEvent(name, {detail})); }

  _open() {
    clearTimeout(this.timer);
    this._status("connecting", {attempt: this.attempt});
    let ws;
    try {
      // The token travels as a subprotocol (a browser cannot set Authorization): checked at
      // the handshake, so the panel never waits among anonymous connections.
      ws = new WebSocket(this.url, [PROTOCOL, `bearer.${base64url(this.token)}`]);
    } catch {
      this._retry();
      return;
    }
    this.ws = ws;
    let denied = false;
    ws.onopen = () => { this.lastHeard = Date.now(); };
    ws.onmessage = (message) => {
      this.lastHeard = Date.now();
      if (this.state === "stale") this._status("open", {recovered: true});
      let frame;
      try { frame = JSON.parse(message.data); } catch { return; }
      if (frame.type === "heartbeat") return;  // heard (lastHeard): that is all it says
      if (frame.type === "events") {
        // One frame for the events ready at once: one task for the browser, not hundreds
        // (which would hold back drawing under a flood).
        for (const event of frame.events) this._event(event);
      } else if (frame.type === "event") {
        this._event(frame);
      } else if (frame.type === "pnl") {
        this._emit("pnl", frame.pnl);  // the P&L of the agents followed, when it changed
      } else if (frame.type === "hello") {
        this.hello = frame;
        this._emit("hello", frame);
        this._subscribe(frame);
      } else if (frame.type === "snapshot") {
        this.attempt = 0;
        this.since = null;
        this._status("open", {position: frame.position});
        if (this.lastPosition !== null && frame.position - this.lastPosition > MAX_CATCH_UP) {
          // Too far behind to replay everything: skip ahead, and say so.
          const from = frame.position - MAX_CATCH_UP;
          this._emit("gap", {from: this.lastPosition, to: from});
          this.lastPosition = from;
          ws.send(JSON.stringify({type: "subscribe", id: "panel", after: from, batch: true, pnl: true,
            providers: this.hello.agents === null}));
          return;
        }
        if (this.lastPosition === null) this.lastPosition = Math.max(0, this.firstAfter);
        this._emit("snapshot", frame);
      } else if (frame.type === "error") {
        if (frame.code === "unauthorized") {
          denied = true;
          this._emit("denied", frame);
        } else if (frame.code === "unavailable") {
          ws.close(4001, "subscription ended");
        }
      }
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (denied) { this.stopped = true; this._status("idle"); return; }
      if (!this.stopped) this._retry();
    };
  }

  _event(frame) {
    if (this.lastPosition !== null && frame.position <= this.lastPosition) return;
    this.lastPosition = frame.position;
    this._emit("event", frame);
  }

  async _subscribe(hello) {
    let after = this.lastPosition;
    if (after === null) {
      // First subscription: replay the recent log so the event list is not empty.
      try {
        const health = await (await fetch("/healthz", {cache: "no-store"})).json();
        after = Math.max(0, health.position - this.backlog);
      } catch { after = 0; }
      this.firstAfter = after;
    }
    if (this.ws?.readyState !== WebSocket.OPEN) return;
    this.ws.send(JSON.stringify({type: "subscribe", id: "panel", after, batch: true, pnl: true,
      providers: hello.agents === null}));
  }

  _retry() {
    this.attempt += 1;
    this.since = this.since || Date.now();
    const wait = Math.min(5000, 300 * 2 ** Math.min(this.attempt - 1, 5)) * (0.8 + Math.random() * 0.4);
    this.nextTry = Date.now() + wait;
    this._status("closed", {attempt: this.attempt, since: this.since, nextTry: this.nextTry});
    this.timer = setTimeout(() => this._open(), wait);
  }

  /** Call the connection stale once it has been silent too long (and say for how long). */
  _watch() {
    if (this.state !== "open" && this.state !== "stale") return;
    const silent = Date.now() - this.lastHeard;
    if (silent > this.staleAfter) {
      this._status("stale", {silentMs: silent, lastHeard: this.lastHeard});
    }
  }

  _ping() {
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    if (Date.now() - this.lastHeard > SILENCE_LIMIT_MS) {
      ws.close(4002, "silent");  // a half-open connection: start again
      return;
    }
    ws.send(JSON.stringify({type: "ping", id: "keepalive"}));
  }
}
