// The panel's entry point: log in with a token, connect, route between views, and keep the
// connection state visible (a banner while disconnected or stale — silent past its
// heartbeats; it reconnects by itself and resumes from the last position it saw).

import {Api} from "./api.js";
import {Connection} from "./connection.js";
import {Controls} from "./controls.js";
import {setText} from "./dom.js";
import {hms, num, setTicks} from "./format.js";
import {createHaltedBanner} from "./halted.js";
import {Model} from "./model.js";
import {createAgentView} from "./views/agent.js";
import {createBlotter} from "./views/blotter.js";
import {createCapacity} from "./views/capacity.js";
import {createCharts} from "./views/charts.js";
import {createEvents} from "./views/events.js";
import {createOverview} from "./views/overview.js";
import {createProviders} from "./views/providers.js";
import {createFeed} from "./views/feed.js";
import {createAlertCenter, createAlerts} from "./views/alerts.js";
import {Toasts} from "./toasts.js";

const TOKEN_KEY = "gateway-panel-token";
const TICK_MS = 500;
const VIEWS = ["overview", "agent", "providers", "events", "charts", "blotter", "feed", "alerts", "capacity"];
const $ = (id) => document.getElementById(id);

let session = null;
const toasts = new Toasts($("toasts"));

function toast(text, ok = true) {
  return toasts.show(text, ok ? "ok" : "bad");
}

function parseRoute() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const params = Object.fromEntries(new URLSearchParams(query));
  const [view, ...rest] = path.split("/");
  if (view === "agent" && rest.length) return {view, params: {...params, id: decodeURIComponent(rest.join("/"))}};
  return {view: VIEWS.includes(view) && view !== "agent" ? view : "overview", params};
}

function route(focus = false) {
  if (!session?.views) return;
  const {view, params} = parseRoute();
  session.current = session.views[view];
  for (const name of VIEWS) $(`${name}-view`).hidden = name !== view;
  for (const link of document.querySelectorAll("[data-view-link]")) {
    if (link.dataset.viewLink === view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${view === "agent" ? params.id : session.current.title} · Trading agent gateway`;
  session.current.show(params);
  if (focus) $("main").focus({preventScroll: true});
}

function showConnection({state, attempt = 0, since = null, nextTry = null, silentMs = 0, lastHeard = null}) {
  document.body.dataset.connection = state;
  const pill = $("connection");
  const banner = $("banner");
  if (state === "open") {
    pill.textContent = "Connected · live";
    banner.hidden = true;
  } else if (state === "stale") {
    const seconds = Math.floor(silentMs / 1000);
    pill.textContent = `Stale · no heartbeat for ${seconds} s`;
    // Words that do not change while it lasts: an alert is read out again at every change.
    setText(banner, `Nothing heard from the gateway since ${hms(lastHeard)}: `
      + "the gateway or the link may be frozen. Figures shown may be out of date; controls may get no answer.");
    banner.hidden = false;
  } else if (state === "connecting") {
    pill.textContent = attempt ? "Reconnecting…" : "Connecting…";
  } else if (state === "closed") {
    pill.textContent = "Disconnected";
    const wait = nextTry ? Math.max(0, Math.ceil((nextTry - Date.now()) / 1000)) : 0;
    banner.textContent = `Disconnected from the gateway since ${hms(since)} — reconnecting by itself `
      + `(attempt ${attempt}${wait ? `, next try in ${wait} s` : ""}). Figures shown may be stale.`;
    banner.hidden = false;
  } else {
    pill.textContent = "Not connected";
  }
}

function buildViews(hello) {
  const {api, model} = session;
  const canOperate = hello.role === "control" || hello.role === "admin";
  const ctx = {api, model, role: hello.role, scoped: hello.agents !== null,
    controls: canOperate ? new Controls({api, toasts, model}) : null};
  session.ctx = ctx;
  session.views = {
    overview: createOverview(ctx), agent: createAgentView(ctx), providers: createProviders(ctx),
    events: createEvents(ctx), charts: createCharts(ctx), blotter: createBlotter(ctx),
    feed: createFeed(ctx), capacity: createCapacity(ctx),
  };
  const center = createAlertCenter(ctx);
  session.views.alerts = createAlerts(ctx, center);
  $("who").before(...center.badges);  // orders awaiting approval, new alerts: on every view
  center.load();
  $("banner").after(createHaltedBanner(ctx));  // "N agents halted", on every view
  $("login-view").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = `${hello.principal} · ${hello.role}${hello.agents ? ` · ${hello.agents.length} agents` : ""}`;
  const stopAll = $("stop-all");
  if (canOperate) {
    stopAll.hidden = false;
    stopAll.onclick = () => ctx.controls.stopAll([...model.agents.keys()]);
  } else {
    stopAll.remove();  // a viewer gets no mutating control at all
  }
  model.addEventListener("change", (event) => {
    session.current?.change(event.detail);
    center.change(event.detail);
  });
  setInterval(() => {
    session.current?.tick();
    center.tick();
    if (session.connection.state === "closed") showConnection({state: "closed", ...session.lastStatus});
  }, TICK_MS);
  route();
}

async function login(token) {
  const error = $("login-error");
  error.textContent = "";
  const api = new Api(token);
  const model = new Model(api);
  try {
    await model.loadTypes();
  } catch (failure) {
    error.textContent = failure.status === 401 ? "The gateway does not know this token."
      : `Cannot log in: ${failure.message}`;
    sessionStorage.removeItem(TOKEN_KEY);
    return;
  }
  try {
    setTicks(await api.get("/api/market"));  // prices are shown to each symbol's tick
  } catch {
    // an older gateway: cents
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  const connection = new Connection(token);
  session = {api, model, connection, views: null, current: null, lastStatus: {}};
  connection.addEventListener("status", (event) => {
    session.lastStatus = event.detail;
    showConnection(event.detail);
  });
  connection.addEventListener("hello", (event) => { if (!session.views) buildViews(event.detail); });
  let snapshots = 0;
  connection.addEventListener("snapshot", (event) => {
    model.applySnapshot(event.detail);
    if (snapshots++ > 0) toast(`Reconnected; resuming from position ${num(connection.lastPosition)}.`);
  });
  connection.addEventListener("event", (event) => model.applyEvent(event.detail));
  connection.addEventListener("pnl", (event) => model.applyPnl(event.detail));
  connection.addEventListener("gap", (event) => toast(
    `Too far behind to replay everything: events ${event.detail.from + 1}–${event.detail.to} are not in the log view.`, false));
  connection.addEventListener("denied", () => logout("The gateway refused this token."));
  model.start();
  connection.start();
}

function logout(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  if (session) {
    session.connection.stop();
    session.model.stop();
  }
  if (message) sessionStorage.setItem("gateway-panel-message", message);
  location.hash = "";
  location.reload();
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  login($("token").value.trim());
});
$("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", () => route(true));
const message = sessionStorage.getItem("gateway-panel-message");
if (message) {
  $("login-error").textContent = message;
  sessionStorage.removeItem("gateway-panel-message");
}
const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) login(saved);
else $("token").focus();
