// The blotter: positions, open orders, fills, cancels and rejections (with their reasons), read
// from GET /api/orders (the desk: every agent in scope, filterable by agent and symbol) or
// GET /api/agents/{id}/orders (a card on the agent page). Folded from the log by the gateway,
// so it is whole after a reload; read again when order events arrive. The desk's P&L comes
// with the subscription (its pnl frames), as prices and fills move it.

import {h, replace, setText} from "../dom.js";
import {age, duration, hms, num, price as priced, stamp, when as timeOf} from "../format.js";
import {confirmDialog} from "../controls.js";
import {createApprovals, isApprovalEvent} from "./approvals.js";
import {money, pnlSection} from "./pnl.js";
import {orderLink} from "./drill.js";

const ORDER_EVENTS = new Set(["OrderAccepted", "OrderRejected", "OrderCancelRequested",
  "OrderFilled", "OrderClosed"]);
const REFRESH_MS = 400;
const QTY = new Intl.NumberFormat("en", {maximumFractionDigits: 8});

/** Whether an event of the log changes a blotter. */
export function isOrderEvent(event) {
  return ORDER_EVENTS.has(event.type);
}

const qty = (n) => QTY.format(n);
const price = (n, symbol) => priced(n, symbol);  // (rounded to the symbol's tick)

/** A time for people (the date too when not today), how long ago in its tooltip. */
function when(ms) {
  return h("time", {datetime: new Date(ms).toISOString(), title: `${stamp(ms)} (${age(ms)})`},
    timeOf(ms));
}

function side(s) {
  return h("span", {class: `side ${s}`}, s === "buy" ? "▲ buy" : "▼ sell");
}

function agentCell(row, desk) {
  return desk ? h("td", {}, h("a", {href: `#/agent/${encodeURIComponent(row.agentId)}`}, row.agentId)) : null;
}

function table(label, columns, rows, empty, desk) {
  if (!rows.length) return h("p", {class: "muted empty"}, empty);
  const heads = desk ? ["Agent", ...columns] : columns;
  for (const row of rows) [...row.cells].forEach((cell, i) => { cell.dataset.label = heads[i]; });  // (phone cards)
  const numeric = [...rows[0].cells].map((cell) => cell.classList.contains("num"));  // a heading sits as its column does
  return h("div", {class: "blotter-scroll"}, h("table", {class: "plain blotter-table", "aria-label": label},
    h("thead", {}, h("tr", {}, heads.map((c, i) => h("th", {scope: "col", class: numeric[i] ? "num" : null}, c)))),
    h("tbody", {}, rows)));
}

function positionRows(body, desk) {
  return body.positions.map((p) => {
    const flat = Math.abs(p.netQty) < 1e-9;
    const word = flat ? "flat" : p.netQty > 0 ? "long" : "short";
    return h("tr", {"data-position": `${p.agentId}/${p.symbol}`, "data-net": p.netQty, class: `pos ${word}`},
      agentCell(p, desk), h("td", {}, h("strong", {}, p.symbol)),
      h("td", {class: "num net"}, `${flat ? "" : p.netQty > 0 ? "+" : "−"}${qty(Math.abs(p.netQty))} ${word}`),
      h("td", {class: "num"}, price(p.avgPrice, p.symbol)),
      h("td", {class: "num"}, qty(p.boughtQty)), h("td", {class: "num"}, qty(p.soldQty)),
      h("td", {class: "num"}, num(p.fills)), h("td", {class: "num"}, money(p.realizedPnl)));
  });
}

function openRows(body, elapsed, desk, cancel) {
  return body.openOrders.map((o) => h("tr", {"data-order": o.orderId},
    agentCell(o, desk), h("td", {class: "mono"}, orderLink(o.agentId, o.orderId),
      o.flattenBy ? [" ", h("span", {class: "tag warn flatten", title: "placed by an operator's flatten, not by the agent"}, `flatten · ${o.flattenBy}`)] : null),
    h("td", {}, o.symbol), h("td", {}, side(o.side)),
    h("td", {class: "num"}, qty(o.qty)), h("td", {class: "num"}, qty(o.filledQty)),
    h("td", {}, o.orderType), h("td", {class: "num"}, price(o.limitPrice, o.symbol)),
    h("td", {class: "num age", "data-age": o.ageMs, title: `placed at ${timeOf(o.placedAt)}`}, duration(o.ageMs + elapsed)),
    h("td", {}, o.cancelRequestedBy ? h("span", {class: "tag warn"}, `cancel asked by ${o.cancelRequestedBy} at ${timeOf(o.cancelRequestedAt)}`)
      : h("span", {class: "tag"}, o.filledQty > 0 ? "partly filled" : "working")),
    cancel ? h("td", {}, cancel.button(o)) : null));
}

function fillRows(body, desk) {
  return body.fills.map((f) => h("tr", {"data-fill": f.orderId},
    agentCell(f, desk), h("td", {}, when(f.at)), h("td", {}, f.symbol), h("td", {}, side(f.side)),
    h("td", {class: "num"}, qty(f.qty)), h("td", {class: "num"}, price(f.price, f.symbol)),
    h("td", {class: "num"}, price(f.decisionPrice, f.symbol)),
    h("td", {class: "num", title: "per unit, worse than the decision price (negative: better)"},
      f.slippage === null || f.slippage === undefined ? "–" : price(f.slippage, f.symbol)),
    h("td", {class: "mono"}, orderLink(f.agentId, f.orderId))));
}

function cancelRows(body, desk) {
  return body.cancels.map((c) => h("tr", {"data-cancel": c.orderId},
    agentCell(c, desk), h("td", {}, when(c.requestedAt)), h("td", {class: "mono"}, orderLink(c.agentId, c.orderId)), h("td", {}, c.symbol),
    h("td", {}, c.by, c.action ? h("span", {class: "muted"}, ` (${c.action})`) : null),
    h("td", {}, h("span", {class: c.status === "cancelled" ? "tag good" : c.status === "pending" ? "tag warn" : "tag"},
      c.status === "pending" ? "pending" : `${c.status} at ${timeOf(c.closedAt)}`))));
}

function rejectionRows(body, desk) {
  return body.rejections.map((r) => h("tr", {"data-rejection": r.orderId ?? r.runId},
    agentCell(r, desk), h("td", {}, when(r.at)), h("td", {}, r.symbol), h("td", {}, side(r.side)),
    h("td", {class: "num"}, qty(r.qty)), h("td", {}, h("span", {class: "tag bad"}, r.source === "gate" ? "trading gate" : "broker")),
    h("td", {class: "reason"}, r.reason)));
}

/** The blotter's sections for an answer of the blotter routes. */
/** The desk's net quantity per symbol (the agents' positions added up), for a desk of several. */
function deskNet(body) {
  if (body.agents.length < 2 || !body.positions.length) return null;
  const net = new Map();
  for (const p of body.positions) net.set(p.symbol, (net.get(p.symbol) ?? 0) + p.netQty);
  return h("p", {class: "desk-net", id: "desk-net"}, h("span", {class: "muted"}, "Desk net: "),
    [...net].sort(([a], [b]) => a.localeCompare(b)).flatMap(([symbol, n], i) => {
      const flat = Math.abs(n) < 1e-9;
      return [i ? " · " : "", h("strong", {}, symbol), " ",
        h("span", {class: flat ? "muted" : n > 0 ? "side buy" : "side sell"}, flat ? "flat" : `${n > 0 ? "+" : "−"}${qty(Math.abs(n))}`)];
    }));
}

export function blotterSections(body, {desk = false, elapsed = 0, cancel = null} = {}) {
  const cut = body.truncated ? ` (the newest ${body.limit})` : "";
  return [
    h("section", {class: "blotter-part", "data-part": "open"},
      h("h4", {}, `Open orders (${body.openOrders.length})`),
      table("Open orders", ["Order", "Symbol", "Side", "Qty", "Filled qty", "Type", "Limit price", "Age", "State",
        ...(cancel ? [""] : [])], openRows(body, elapsed, desk, cancel), "No open order.", desk)),
    h("section", {class: "blotter-part", "data-part": "positions"},
      h("h4", {}, `Positions (${body.positions.length})`), desk ? deskNet(body) : null,
      table("Positions", ["Symbol", "Net qty", "Avg price", "Bought", "Sold", "Fills", "Realized"], positionRows(body, desk),
        "No position: nothing filled yet.", desk)),
    h("section", {class: "blotter-part", "data-part": "fills"},
      h("h4", {}, `Fills${cut}`),
      table("Fills", ["Time", "Symbol", "Side", "Qty", "Price", "Decision price", "Slippage", "Order"], fillRows(body, desk), "No fill.", desk)),
    h("section", {class: "blotter-part", "data-part": "rejections"},
      h("h4", {}, `Rejections${cut}`),
      table("Rejections", ["Time", "Symbol", "Side", "Qty", "By", "Reason"], rejectionRows(body, desk), "No rejection.", desk)),
    h("section", {class: "blotter-part", "data-part": "cancels"},
      h("h4", {}, `Cancels${cut}`),
      table("Cancels", ["Asked at", "Order", "Symbol", "Asked by", "Outcome"], cancelRows(body, desk), "No cancel.", desk)),
  ];
}

/** Read a blotter route (now, or at most once per REFRESH_MS) and `draw` the answer; `tick`
 * advances the open orders' ages in `container` between reads. */
function loader(ctx, path, params, draw, status, container) {
  let timer = null;
  let loading = false;
  let again = false;
  let body = null;
  let at = 0;

  async function load() {
    timer = null;
    if (loading) { again = true; return; }
    loading = true;
    try {
      body = await ctx.api.get(path(), params());
      at = Date.now();
      draw(body, 0);
    } catch (error) {
      setText(status, `Cannot load the orders: ${error.message}`);
    } finally {
      loading = false;
      if (again) { again = false; schedule(); }
    }
  }

  function schedule() {
    if (timer === null) timer = setTimeout(load, REFRESH_MS);
  }

  return {
    load, schedule,
    tick() {
      if (!body) return;
      for (const cell of container.querySelectorAll("td.age[data-age]")) setText(cell, duration(Number(cell.dataset.age) + Date.now() - at));
    },
  };
}

/** What the answer to a cancel of `order` says, as {ok, kind, text} (the controls' shape). */
async function cancelOrder(ctx, order) {
  const what = `Cancel ${order.orderId}`;
  try {
    const ack = await ctx.api.post(`/api/agents/${encodeURIComponent(order.agentId)}/control`,
      {action: "cancel_order", orderId: order.orderId, reason: "panel"});
    if (ack.decision !== "accepted") {
      return {ok: false, kind: "bad", text: `${what}: ${ack.decision}${ack.reason ? ` — ${ack.reason}` : ""}`};
    }
    if (ack.effect && !ack.effect.changed) {
      return {ok: true, kind: "info", text: `${what}: its cancel was sent already — nothing changed`};
    }
    return {ok: true, kind: "ok", text: `${what}: cancel sent to the broker (log position ${ack.position}); `
      + "the order closes when the broker confirms, unless a fill comes first"};
  } catch (error) {
    return {ok: false, kind: "bad", text: `${what} failed: ${error.message} (${error.code}); nothing was asked`};
  }
}

/**
 * Cancel buttons for open orders (control and admin tokens only): a confirm, then the
 * controls' "pending…", the answer, or "outcome unknown" when none comes in time (the
 * Cancels list shows what happened), in `result` and as a notification.
 */
function canceller(ctx, result, reload) {
  if (!ctx.controls) return null;
  const busy = new Set();

  function report(answer) {
    result.textContent = answer.text;
    result.className = `result ${answer.kind === "pending" || answer.kind === "info" ? "warn" : answer.ok ? "ok" : "bad"}`;
  }

  async function cancel(order) {
    const what = `${order.side} ${qty(order.qty)} ${order.symbol}`;
    if (!await confirmDialog(`Cancel order ${order.orderId}?`,
      `Ask the broker to cancel ${order.agentId}'s open order ${order.orderId} (${what}, ${qty(order.filledQty)} filled). A fill that comes first stands.`,
      "Cancel order", null, "Keep order")) return;
    busy.add(order.orderId);
    reload();
    try {
      await ctx.controls.track(`Cancel ${order.orderId}`, cancelOrder(ctx, order), report, "the Cancels list");
    } finally {
      busy.delete(order.orderId);
      reload();
    }
  }

  return {
    button(order) {
      if (order.cancelRequestedBy) return h("span", {class: "muted"}, "cancel sent");
      const pending = busy.has(order.orderId);
      return h("button", {type: "button", class: "small", "data-mutating": true, "data-cancel-order": order.orderId,
        "aria-label": `Cancel order ${order.orderId} of ${order.agentId}`, "aria-busy": pending ? "true" : null,
        onclick: pending ? null : () => cancel(order)}, pending ? "Cancelling…" : "Cancel");
    },
  };
}

function summary(body) {
  const open = body.openOrders.length;
  const held = body.positions.filter((p) => Math.abs(p.netQty) >= 1e-9).length;
  return `${num(open)} open order${open === 1 ? "" : "s"} · ${num(held)} open position${held === 1 ? "" : "s"}`
    + ` · read from the log at ${hms(body.at)}`;
}

/** The blotter card of one agent's page; `change(detail)` reads it again on its order events. */
export function createAgentBlotter(ctx, agentId) {
  const status = h("p", {class: "muted", id: "agent-blotter-status", role: "status"}, "Loading…");
  const parts = h("div", {class: "blotter", id: "agent-blotter"});
  const result = h("p", {class: "result", role: "status", id: "agent-blotter-result"});
  const el = h("section", {class: "card blotter-card", "aria-labelledby": "agent-blotter-title"},
    h("h3", {id: "agent-blotter-title"}, "Orders and positions ",
      h("a", {href: `#/blotter?agent=${encodeURIComponent(agentId)}`, class: "muted small-link"}, "(desk blotter)")),
    status, ctx.controls ? result : null, parts);
  let last = null;
  const cancel = canceller(ctx, result, () => { if (last) draw(last); reader.schedule(); });
  function draw(body) {
    last = body;
    setText(status, summary(body));
    replace(parts, blotterSections(body, {cancel}));
  }
  const reader = loader(ctx, () => `/api/agents/${encodeURIComponent(agentId)}/orders`, () => ({}), draw, status, parts);
  reader.load();
  // Order events of this agent since the last look (live, or while another view was shown).
  let seen = ctx.model.position;
  function check() {
    const events = ctx.model.events;
    let moved = false;
    for (let i = events.length - 1; i >= 0 && events[i].position > seen; i--) {
      if (events[i].stream === agentId && isOrderEvent(events[i])) { moved = true; break; }
    }
    seen = Math.max(seen, events.at(-1)?.position ?? 0);
    if (moved) reader.schedule();
  }
  return {
    el,
    change: check,
    tick() { check(); reader.tick(); },
  };
}

/** The desk blotter view (`#/blotter?agent=&symbol=`). */
export function createBlotter(ctx) {
  const section = document.getElementById("blotter-view");
  const agent = h("select", {id: "blotter-agent"});
  const symbol = h("input", {id: "blotter-symbol", type: "search", placeholder: "e.g. BTCUSD", maxlength: 32, size: 12,
    autocomplete: "off", spellcheck: "false"});
  const status = h("p", {class: "muted", id: "blotter-status", role: "status"}, "Loading…");
  const parts = h("div", {class: "blotter", id: "desk-blotter"});
  const pnlPart = h("div", {class: "blotter", id: "desk-pnl-part"});
  const result = h("p", {class: "result", role: "status", id: "blotter-result"});
  let filters = {agent: "", symbol: ""};
  let last = null;
  const cancel = canceller(ctx, result, () => { if (last) draw(last); reader.schedule(); });
  const approvals = createApprovals(ctx);

  function fillAgents() {
    const ids = [...ctx.model.agents.keys()].sort();
    const want = ["", ...ids];
    if ([...agent.options].map((o) => o.value).join("\n") !== want.join("\n")) {
      replace(agent, h("option", {value: ""}, "All agents"), ids.map((id) => h("option", {value: id}, id)));
    }
    agent.value = filters.agent;
  }

  function setFilters(next) {
    filters = next;
    const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v)).toString();
    const hash = `#/blotter${query ? `?${query}` : ""}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
    reader.load();
    loadPnl();
    approvals.load(filters.agent);
  }

  agent.addEventListener("change", () => setFilters({...filters, agent: agent.value}));
  symbol.addEventListener("change", () => setFilters({...filters, symbol: symbol.value.trim().toUpperCase()}));
  replace(section,
    h("h2", {id: "blotter-title"}, "Blotter"),
    h("p", {class: "muted"}, "Every order of every agent in this token's scope, from the log: open orders, fills, cancels, rejections with their reasons, and the position per symbol."),
    h("div", {class: "toolbar", role: "search", "aria-label": "Filter the blotter"},
      h("label", {for: "blotter-agent"}, "Agent"), agent, h("label", {for: "blotter-symbol"}, "Symbol"), symbol),
    approvals.el, status, ctx.controls ? result : null, pnlPart, parts);

  /** The P&L: from the subscription's pnl frames (as they change), read over HTTP only until
   * the first one comes; for the one agent filtered to, if any. */
  async function loadPnl() {
    if (ctx.model.pnl) {
      drawPnl();
      return;
    }
    try {
      replace(pnlPart, pnlSection(await ctx.api.get("/api/pnl", {agent: filters.agent})));
    } catch (error) {
      replace(pnlPart, h("p", {class: "result bad"}, `Cannot load the P&L: ${error.message}`));
    }
  }

  function drawPnl() {
    const view = ctx.model.pnl;
    if (!filters.agent) {
      replace(pnlPart, pnlSection(view));
      return;
    }
    const agent = view.agents.find((a) => a.agentId === filters.agent);
    replace(pnlPart, pnlSection({...view, agents: agent ? [agent] : [], desk: agent ? agent.totals
      : {marketValue: 0, exposure: 0, unrealized: 0, realized: 0, total: 0, complete: true, stale: false}}));
  }

  function draw(body) {
    last = body;
    const scope = [body.agents.length === 1 ? body.agents[0] : `${body.agents.length} agents`, body.symbol].filter(Boolean).join(" · ");
    setText(status, `${scope} — ${summary(body)}`);
    replace(parts, blotterSections(body, {desk: true, cancel}));
  }
  const reader = loader(ctx, () => "/api/orders", () => ({agent: filters.agent, symbol: filters.symbol}), draw, status, parts);

  return {
    section,
    title: "Blotter",
    show(params) {
      filters = {agent: params.agent ?? "", symbol: params.symbol ?? ""};
      symbol.value = filters.symbol;
      fillAgents();
      reader.load();
      loadPnl();
      approvals.load(filters.agent);
    },
    change(detail) {
      if (detail.agents) fillAgents();
      if (detail.events.some(isOrderEvent)) reader.schedule();
      if (detail.pnl) drawPnl();
      if (detail.events.some(isApprovalEvent)) approvals.load();
    },
    tick() {
      reader.tick(); approvals.tick();
    },
  };
}
