// Alerts: the newest from GET /api/alerts (from the log, and the feed's), filterable by
// kind; read again as alert-making events arrive and every few seconds (the feed's). New
// alerts may also be said as browser notifications (after the browser's permission) and
// with a short sound, each the operator's choice, kept in this browser. The header shows how
// many orders wait for approval and how many alerts came since the list was last looked at.

import {h, replace, setText} from "../dom.js";
import {hms} from "../format.js";

const ALERT_EVENTS = new Set(["ControlApplied", "OrderRejected", "OrderClosed", "BreakerOpened",
  "BudgetAlert", "RunsHeld", "DeskBudgetApplied", "ApprovalRequested", "ApprovalDecided", "DeskKilled"]);
const KINDS = ["halt", "order_rejected", "breaker_open", "budget", "approval_waiting", "connector", "stale_feed"];
const POLL_MS = 5_000;
const SETTINGS = "gateway.alerts";

function settings() {
  try { return JSON.parse(localStorage.getItem(SETTINGS) ?? "{}"); } catch { return {}; }
}

function save(value) {
  localStorage.setItem(SETTINGS, JSON.stringify(value));
}

function beep() {
  const Audio = window.AudioContext ?? window.webkitAudioContext;
  if (!Audio) return;
  const audio = new Audio();
  const tone = audio.createOscillator();
  const gain = audio.createGain();
  tone.frequency.value = 880;
  gain.gain.value = 0.08;
  tone.connect(gain).connect(audio.destination);
  tone.start();
  tone.stop(audio.currentTime + 0.18);
  tone.onended = () => audio.close();
}

/** The alerts, seen by every view: reads them, says new ones, counts what waits. */
export function createAlertCenter(ctx) {
  const count = h("a", {href: "#/alerts", id: "alerts-count", class: "pill", hidden: true, title: "alerts since you last looked"});
  const approvals = h("a", {href: "#/blotter", id: "approvals-count", class: "pill warn", hidden: true,
    title: "orders waiting for a human's approval"});
  const listeners = new Set();
  let known = null;  // alert ids seen (null: not read yet: the first read says nothing)
  let unseen = 0;
  let last = {alerts: [], rules: []};
  let at = 0;
  let loading = false;

  function say(fresh) {
    const chosen = settings();
    if (chosen.sound && fresh.some((a) => a.severity !== "info")) beep();
    if (chosen.notify && window.Notification?.permission === "granted") {
      for (const alert of fresh.slice(0, 5)) {
        new Notification(`Gateway: ${alert.kind.replace("_", " ")}`, {body: alert.text, tag: alert.id});
      }
    }
  }

  async function load() {
    if (loading) return;
    loading = true;
    at = Date.now();
    try {
      const [body, waiting] = await Promise.all([ctx.api.get("/api/alerts", {limit: 200}),
        ctx.api.get("/api/approvals")]);
      last = body;
      const ids = new Set(body.alerts.map((a) => a.id));
      if (known !== null) {
        const fresh = body.alerts.filter((a) => !known.has(a.id));
        if (fresh.length) {
          unseen += fresh.length;
          say(fresh);
        }
      }
      known = ids;
      count.hidden = unseen === 0;
      setText(count, `${unseen} new`);
      count.setAttribute("aria-label", `${unseen} new alert${unseen === 1 ? "" : "s"}`);
      const n = waiting.approvals.length;
      approvals.hidden = n === 0;
      setText(approvals, `${n} to approve`);
      approvals.setAttribute("aria-label", `${n} order${n === 1 ? "" : "s"} awaiting approval`);
      for (const listener of listeners) listener(body);
    } catch {
      // (the list says why when it is shown; the header stays as it was)
    } finally {
      loading = false;
    }
  }

  return {
    badges: [approvals, count],
    get last() { return last; },
    load,
    seen() { unseen = 0; count.hidden = true; },
    listen(listener) { listeners.add(listener); },
    change(detail) { if (detail.events?.some((e) => ALERT_EVENTS.has(e.type))) load(); },
    tick() { if (Date.now() - at >= POLL_MS) load(); },
  };
}

/** The Alerts view (`#/alerts`). */
export function createAlerts(ctx, center) {
  const section = document.getElementById("alerts-view");
  const kind = h("select", {id: "alerts-kind"}, h("option", {value: ""}, "Every kind"),
    KINDS.map((k) => h("option", {value: k}, k.replace("_", " "))));
  const notify = h("input", {type: "checkbox", id: "alerts-notify"});
  const sound = h("input", {type: "checkbox", id: "alerts-sound"});
  const status = h("p", {class: "muted", id: "alerts-status", role: "status"}, "Loading…");
  const list = h("ul", {class: "alerts", id: "alerts-list"});
  const chosen = settings();
  notify.checked = Boolean(chosen.notify) && window.Notification?.permission === "granted";
  sound.checked = Boolean(chosen.sound);

  notify.addEventListener("change", async () => {
    if (notify.checked && window.Notification && Notification.permission !== "granted") {
      notify.checked = await Notification.requestPermission() === "granted";
    }
    save({...settings(), notify: notify.checked});
  });
  sound.addEventListener("change", () => save({...settings(), sound: sound.checked}));
  kind.addEventListener("change", () => draw(center.last));

  replace(section, h("h2", {id: "alerts-title"}, "Alerts"),
    h("p", {class: "muted"}, "What the desk must hear of at once, newest first: halts, refused orders, open breakers, budgets, orders waiting for approval (from the log), and the feed's connectors and quiet symbols."),
    h("div", {class: "toolbar"}, h("label", {for: "alerts-kind"}, "Kind"), kind,
      h("label", {}, notify, " Browser notifications"), h("label", {}, sound, " Sound")),
    status, list);

  function draw(body) {
    const shown = body.alerts.filter((a) => !kind.value || a.kind === kind.value);
    setText(status, `${shown.length} alert${shown.length === 1 ? "" : "s"} · rules: ${body.rules.join(", ") || "none"}`);
    replace(list, shown.length ? shown.map((a) => h("li", {class: `alert ${a.severity}`, "data-alert": a.id, "data-kind": a.kind},
      h("span", {class: a.severity === "critical" ? "tag bad" : a.severity === "warning" ? "tag warn" : "tag"}, a.kind.replace("_", " ")),
      " ", h("time", {datetime: new Date(a.at).toISOString()}, hms(a.at)), " ",
      a.agentId ? h("a", {href: `#/agent/${encodeURIComponent(a.agentId)}`}, a.agentId) : null, " ",
      h("span", {class: "text"}, a.text)))
      : [h("li", {class: "muted"}, "No alert.")]);
  }
  center.listen((body) => { if (!section.hidden) draw(body); });

  return {
    section,
    title: "Alerts",
    show() { center.seen(); draw(center.last); center.load(); },
    change() {},
    tick() {},
  };
}
