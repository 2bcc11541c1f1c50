// Orders waiting for a human's approval, read from GET /api/approvals (every agent in scope,
// or the one the blotter is filtered to), the soonest to expire first, with Approve and
// Reject for control and admin tokens (POST /api/agents/{id}/control, action approve or
// reject). Read again when an approval event arrives, and each second for the time left.

import {h, replace, setText} from "../dom.js";
import {duration, price} from "../format.js";
import {confirmDialog} from "../controls.js";

const APPROVAL_EVENTS = new Set(["ApprovalRequested", "ApprovalDecided"]);
const MONEY = new Intl.NumberFormat("en", {maximumFractionDigits: 2});

/** Whether an event of the log changes what waits for approval. */
export function isApprovalEvent(event) {
  return APPROVAL_EVENTS.has(event.type);
}

function words(order) {
  const limit = order.limitPrice ? ` at ${price(order.limitPrice, order.symbol)}` : "";
  return `${order.side} ${order.qty} ${order.symbol} ${order.orderType}${limit}`;
}

/** What the answer to an approve or reject says, as {ok, kind, text} (the controls' shape). */
async function decide(ctx, item, action, reason) {
  const what = `${action === "approve" ? "Approve" : "Reject"} ${item.approvalId}`;
  try {
    const ack = await ctx.api.post(`/api/agents/${encodeURIComponent(item.agentId)}/control`,
      {action, approvalId: item.approvalId, reason});
    if (ack.decision !== "accepted") {
      return {ok: false, kind: "bad", text: `${what}: ${ack.decision}${ack.reason ? ` — ${ack.reason}` : ""}`};
    }
    return {ok: true, kind: "ok", text: action === "approve"
      ? `${what}: approved; the order goes to the trading gate and the broker`
      : `${what}: rejected; ${item.agentId} is told`};
  } catch (error) {
    return {ok: false, kind: "bad", text: `${what} failed: ${error.message} (${error.code}); nothing was decided`};
  }
}

/** The approvals card of the blotter view: `load(agent)` reads it for one agent or all. */
export function createApprovals(ctx) {
  const status = h("p", {class: "muted", id: "approvals-status", role: "status"}, "Loading…");
  const list = h("div", {id: "approvals-list"});
  const result = h("p", {class: "result", role: "status", id: "approvals-result"});
  const el = h("section", {class: "card approvals-card", "aria-labelledby": "approvals-title"},
    h("h3", {id: "approvals-title"}, "Waiting for approval"), status, ctx.controls ? result : null, list);
  let agent = "";
  let items = [];
  let at = Date.now();
  let asked = 0;
  const busy = new Set();

  function report(answer) {
    result.textContent = answer.text;
    result.className = `result ${answer.kind === "pending" ? "warn" : answer.ok ? "ok" : "bad"}`;
  }

  async function act(item, action) {
    const approve = action === "approve";
    const notional = item.notional === null ? "price not known" : `notional ${MONEY.format(item.notional)}`;
    if (!await confirmDialog(`${approve ? "Approve" : "Reject"} order ${item.orderId}?`,
      `${item.agentId} wants to ${words(item.order)} (${notional}). `
        + (approve ? "Approved, it goes to the trading gate and then the broker." : "Rejected, it is never placed; the agent is told."),
      approve ? "Approve" : "Reject")) return;
    busy.add(item.approvalId);
    draw();
    try {
      await ctx.controls.track(`${approve ? "Approve" : "Reject"} ${item.approvalId}`,
        decide(ctx, item, action, "panel"), report, "the approvals list");
    } finally {
      busy.delete(item.approvalId);
      load(agent);
    }
  }

  function row(item) {
    const left = Math.max(0, item.expiresInMs - (Date.now() - at));
    const pending = busy.has(item.approvalId);
    const buttons = ctx.controls ? h("td", {class: "actions"},
      h("button", {type: "button", class: "small", "data-mutating": true, "data-approve": item.approvalId,
        disabled: pending || null, onclick: () => act(item, "approve")}, "Approve"),
      h("button", {type: "button", class: "small danger", "data-mutating": true, "data-reject": item.approvalId,
        disabled: pending || null, onclick: () => act(item, "reject")}, "Reject")) : null;
    return h("tr", {"data-approval": item.approvalId},
      h("td", {}, h("a", {href: `#/agent/${encodeURIComponent(item.agentId)}`}, item.agentId)),
      h("td", {}, item.orderId), h("td", {}, words(item.order)),
      h("td", {class: "num"}, item.notional === null ? "–" : MONEY.format(item.notional)),
      h("td", {class: "num age", "data-left": left}, duration(left)), buttons);
  }

  function draw() {
    if (!items.length) {
      replace(list, h("p", {class: "muted empty"}, "No order waits for approval."));
      return;
    }
    const heads = ["Agent", "Order", "What", "Notional", "Expires in", ...(ctx.controls ? [""] : [])];
    replace(list, h("div", {class: "blotter-scroll"}, h("table", {class: "plain blotter-table", "aria-label": "Orders waiting for approval"},
      h("thead", {}, h("tr", {}, heads.map((c) => h("th", {scope: "col"}, c)))),
      h("tbody", {}, items.map(row)))));
  }

  async function load(which = agent) {
    agent = which;
    const mine = ++asked;  // (answers may cross: only the last one asked is shown)
    try {
      const body = await ctx.api.get("/api/approvals", {agent});
      if (mine !== asked) return;
      items = body.approvals;
      at = Date.now();
      setText(status, `${items.length} order${items.length === 1 ? "" : "s"} waiting`);
      draw();
    } catch (error) {
      if (mine === asked) setText(status, `Cannot read the approvals: ${error.message}`);
    }
  }

  return {
    el, load,
    tick() {
      for (const cell of list.querySelectorAll("td.age[data-left]")) {
        setText(cell, duration(Math.max(0, Number(cell.dataset.left) - (Date.now() - at))));
      }
    },
  };
}
