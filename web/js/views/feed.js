// Feed health: each connector's status, each symbol's last data and its age (stale past the
// limit), warnings in words, and the hook rules' pause (GET /api/feed; control and admin
// tokens for the whole desk may pause and resume the rules: POST /api/feed/hooks).

import {h, replace, setText} from "../dom.js";
import {clock, duration, hms, num, price} from "../format.js";
import {confirmDialog} from "../controls.js";

const POLL_MS = 2_000;

function statusTag(status) {
  return h("span", {class: status === "up" ? "tag good" : status === "down" ? "tag bad" : "tag warn"}, status);
}

/** A table of `rows` under `heads`, each heading placed as its column's cells are; on a
 * phone, each row a card of "heading: value" lines (it never widens the page). */
function cards(label, heads, rows) {
  for (const row of rows) [...row.cells].forEach((cell, i) => { cell.dataset.label = heads[i]; });
  const numeric = rows.length ? [...rows[0].cells].map((cell) => cell.classList.contains("num")) : [];
  return h("table", {class: "plain cards", "aria-label": label},
    h("thead", {}, h("tr", {}, heads.map((c, i) => h("th", {scope: "col", class: numeric[i] ? "num" : null}, c)))),
    h("tbody", {}, rows));
}

function connectors(body) {
  if (!body.connectors.length) return h("p", {class: "muted empty"}, "No connector has reported its status.");
  return cards("Connectors", ["Connector", "Status", "Detail", "Since", "Last report"],
    body.connectors.map((c) => h("tr", {"data-connector": c.connector},
      h("td", {}, h("strong", {}, c.connector)), h("td", {}, statusTag(c.status)),
      h("td", {}, c.detail ?? "–"), h("td", {}, `${duration(c.sinceMs)} ago`),
      h("td", {}, `${duration(c.ageMs)} ago`))));
}

function symbols(body) {
  if (!body.symbols.length) return h("p", {class: "muted empty"}, "No market data yet.");
  return cards("Symbols", ["Symbol", "Last price", "Last data", "Ticks", "Candles", "Fresh"],
    body.symbols.map((s) => h("tr", {"data-symbol": s.symbol, class: s.stale ? "stale" : null},
      h("td", {}, h("strong", {}, s.symbol)), h("td", {class: "num"}, price(s.price, s.symbol)),
      h("td", {title: clock(s.lastAt)}, `${duration(s.ageMs)} ago`),
      h("td", {class: "num"}, num(s.ticks)), h("td", {class: "num"}, num(s.candles)),
      h("td", {}, s.stale ? h("span", {class: "tag warn"}, "stale") : h("span", {class: "tag good"}, "fresh")))));
}

export function createFeed(ctx) {
  const section = document.getElementById("feed-view");
  const status = h("p", {class: "muted", id: "feed-status", role: "status"}, "Loading…");
  const warnings = h("ul", {class: "warnings", id: "feed-warnings"});
  const body = h("div", {class: "feed", id: "feed-health"});
  const result = h("p", {class: "result", role: "status", id: "feed-result"});
  const toggle = h("button", {type: "button", id: "feed-hooks", "data-mutating": true, hidden: true});
  const mayPause = ctx.controls && !ctx.scoped;
  let last = null;
  let at = 0;

  replace(section, h("h2", {id: "feed-title"}, "Feed"),
    h("p", {class: "muted"}, "What the market feed says: each connector's status, each symbol's last data (stale when nothing came for a while), and whether the hook rules turn market events into requests."),
    status, warnings, mayPause ? h("div", {class: "toolbar"}, toggle, result) : null, body);

  async function flip() {
    const pausing = !last.hooks.paused;
    if (pausing && !await confirmDialog("Pause the hook rules?",
      "No market event will trigger a request until they are resumed (prices, the paper broker and this page still follow the feed). Logged with your name.",
      "Pause hook rules")) return;
    try {
      const answer = await ctx.api.post("/api/feed/hooks", {paused: pausing, reason: "panel"});
      setText(result, answer.changed ? `Hook rules ${pausing ? "paused" : "resumed"}.` : "Nothing changed: they already were.");
      result.className = "result ok";
    } catch (error) {
      setText(result, `Failed: ${error.message}; nothing changed`);
      result.className = "result bad";
    }
    load();
  }
  toggle.addEventListener("click", flip);

  function draw(answer) {
    last = answer;
    const hooks = answer.hooks;
    const count = (n, word) => `${num(n)} ${word}${n === 1 ? "" : "s"}`;
    setText(status, `${count(answer.connectors.length, "connector")} · ${count(answer.symbols.length, "symbol")} · hook rules `
      + (hooks.paused ? `paused by ${hooks.by} at ${hms(hooks.at)} (${num(hooks.suppressed)} requests not sent)` : "on")
      + ` · read at ${hms(answer.at)}`);
    replace(warnings, answer.warnings.map((w) => h("li", {class: "warn"}, w)));
    toggle.hidden = false;
    setText(toggle, hooks.paused ? "Resume hook rules" : "Pause hook rules");
    toggle.className = hooks.paused ? "" : "danger";
    replace(body, h("h3", {}, "Connectors"), connectors(answer), h("h3", {}, "Symbols"), symbols(answer));
  }

  async function load() {
    at = Date.now();
    try {
      draw(await ctx.api.get("/api/feed"));
    } catch (error) {
      setText(status, `Cannot read the feed's health: ${error.message}`);
    }
  }

  return {
    section,
    title: "Feed",
    show() { load(); },
    change() {},
    tick() { if (Date.now() - at >= POLL_MS) load(); },
  };
}
