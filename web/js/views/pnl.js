// P&L on the desk blotter: each position marked to the feed's latest price, realized and
// unrealized, exposure, and totals per agent and for the desk: the subscription's pnl frames
// (as fills and prices move it), or GET /api/pnl until the first one comes. Prices to the
// symbol's tick.

import {h} from "../dom.js";
import {duration, price} from "../format.js";

const MONEY = new Intl.NumberFormat("en", {minimumFractionDigits: 2, maximumFractionDigits: 2});
const QTY = new Intl.NumberFormat("en", {maximumFractionDigits: 8});

/** A signed amount of money, coloured by its sign ("–" when not known). */
export function money(n) {
  if (n === null || n === undefined) return h("span", {class: "muted", title: "not known: a price or a cost is missing"}, "–");
  const sign = n > 0 ? "+" : n < 0 ? "\u2212" : "";
  return h("span", {class: n > 0 ? "pnl up" : n < 0 ? "pnl down" : "pnl"}, `${sign}${MONEY.format(Math.abs(n))}`);
}

function markCell(p) {
  if (p.mark === null) return h("td", {class: "num"}, h("span", {class: "tag warn"}, "no price"));
  const aged = p.markAgeMs === null ? "" : `${duration(p.markAgeMs)} old`;
  return h("td", {class: "num", title: aged}, price(p.mark, p.symbol),
    p.stale ? h("span", {class: "tag warn", title: aged}, " stale") : null);
}

function rows(body, desk) {
  return body.agents.flatMap((a) => a.positions.map((p) => {
    const row = h("tr", {"data-pnl": `${a.agentId}/${p.symbol}`, class: p.stale ? "stale" : null},
      desk ? h("td", {}, h("a", {href: `#/agent/${encodeURIComponent(a.agentId)}`}, a.agentId)) : null,
      h("td", {}, h("strong", {}, p.symbol)), h("td", {class: "num"}, QTY.format(p.netQty)),
      h("td", {class: "num"}, price(p.avgPrice, p.symbol)), markCell(p),
      h("td", {class: "num"}, p.exposure === null ? "–" : MONEY.format(p.exposure)),
      h("td", {class: "num"}, money(p.unrealized)), h("td", {class: "num"}, money(p.realized)));
    const heads = [...(desk ? ["Agent"] : []), "Symbol", "Net qty", "Avg price", "Mark", "Exposure", "Unrealized", "Realized"];
    [...row.cells].forEach((cell, i) => { cell.dataset.label = heads[i]; });  // (phone cards)
    return row;
  }));
}

/** The P&L section for an answer of GET /api/pnl. */
export function pnlSection(body, {desk = true} = {}) {
  const t = body.desk;
  const heads = [...(desk ? ["Agent"] : []), "Symbol", "Net qty", "Avg price", "Mark", "Exposure", "Unrealized", "Realized"];
  const found = rows(body, desk);
  return h("section", {class: "blotter-part", "data-part": "pnl", id: "desk-pnl"},
    h("h4", {}, "P&L"),
    h("p", {class: "pnl-totals", id: "pnl-totals"},
      h("span", {class: "muted"}, desk ? "Desk: " : "Total: "), "P&L ", money(t.total),
      " (unrealized ", money(t.unrealized), ", realized ", money(t.realized), ") · exposure ",
      MONEY.format(t.exposure),
      t.stale ? h("span", {class: "tag warn", title: `a mark is older than ${duration(body.staleMs)}`}, " stale prices") : null,
      t.complete ? null : h("span", {class: "tag warn", title: "a fill had no price, or a position has no mark"}, " incomplete")),
    found.length ? h("div", {class: "blotter-scroll"}, h("table", {class: "plain blotter-table", "aria-label": "P&L"},
      h("thead", {}, h("tr", {}, heads.map((c) => h("th", {scope: "col", class: c === "Agent" || c === "Symbol" ? null : "num"}, c)))),
      h("tbody", {}, found)))
      : h("p", {class: "muted empty"}, "No position: nothing filled yet."));
}
