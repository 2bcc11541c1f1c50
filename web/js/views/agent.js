// Agent detail: the two lanes side by side (control actions with their results; the active run
// and the pending list), the controls the token allows, and time travel over the agent's log.

import {attention, badgeState, reasonsOf, reasonText} from "../blocked.js";
import {h, replace, setAttr, setState, setText, stateBadge} from "../dom.js";
import {budget, clock, duration, when} from "../format.js";
import {Model} from "../model.js";
import {ACTIONS} from "../controls.js";
import {pendingTable, runCard} from "./queue.js";
import {createTimeline} from "./timeline.js";
import {createCallTree, isCallEvent} from "./calls.js";
import {createRunHistory} from "./runs.js";
import {createAgentBlotter} from "./blotter.js";
import {createDrill} from "./drill.js";
import {createMessageBox} from "./message.js";
import {createWhatIf} from "./whatif.js";

const PAGE = 1000;
const QUEUE_REFRESH_MS = 250;
const CONTROL_DECISIONS = new Set(["ControlApplied", "RunsHeld", "RunsUnheld", "OperatorApplied", "OperatorRejected"]);

/** The control lane's history: every control input with the decisions made of it, newest first. */
export function controlActions(stream) {
  const groups = [];
  let current = null;
  for (const e of stream) {
    if (e.input) {
      current = {input: e, decisions: []};
      groups.push(current);
    } else if (current) {
      current.decisions.push(e);
    }
  }
  return groups.filter((g) => {
    const d = g.input.data;
    const control = (g.input.type === "RequestReceived" && d.request?.kind === "user_control" && d.request.payload?.action)
      || g.input.type === "OperatorCommand";
    return control || g.decisions.some((x) => CONTROL_DECISIONS.has(x.type));
  }).reverse();
}

function describeAction(group) {
  const d = group.input.data;
  if (group.input.type === "RequestReceived") {
    const r = d.request;
    const what = r.payload?.action || (r.kind === "system_alert" ? `system_alert ${r.payload?.code ?? ""}` : r.kind);
    return `${what}${d.principal ? ` by ${d.principal}` : ""}`;
  }
  if (group.input.type === "OperatorCommand") return `${d.action}${d.run_id ? ` ${d.run_id}` : ""} by ${d.principal}`;
  return group.input.type;
}

function describeResult(group) {
  const parts = [];
  let ok = true;
  for (const e of group.decisions) {
    const d = e.data;
    if (e.type === "ControlApplied" || e.type === "RunsHeld") parts.push(`${d.from_state} → ${d.to_state}`);
    else if (e.type === "RunAborted") parts.push(`aborted ${d.run_id}`);
    else if (e.type === "OperatorApplied") parts.push(`applied${d.detail ? `: ${d.detail}` : ""}`);
    else if (e.type === "OrderCancelRequested") parts.push(`cancel ${d.order_id}`);
    else if (e.type === "RunsUnheld") parts.push("hold lifted");
    else if (e.type === "RequestRepeated") parts.push(`repeat (first: ${d.first_decision})`);
    else if (e.type === "RequestRejected" || e.type === "OperatorRejected") { ok = false; parts.push(`refused: ${d.reason}`); }
  }
  return {text: parts.join(" · ") || "no change", ok};
}

export function createAgentView(ctx) {
  const section = document.getElementById("agent-view");
  let agentId = null;
  let stream = [];
  let more = false;
  let loaded = false;
  let queue = null;
  let queueTimer = null;
  let generation = 0;
  let timeline = null;
  let calls = null;
  let runs = null;
  let blotter = null;
  let drill = null;
  let parts = null;

  /** Whether the token may see an agent of this id (the model's list, or the gateway). */
  async function known(id) {
    if (ctx.model.agents.size) return ctx.model.agents.has(id);
    try {
      await ctx.api.get(`/api/agents/${encodeURIComponent(id)}`);
      return true;
    } catch (error) {
      return error.status !== 404 && error.status !== 403;  // (unreachable now: try the page)
    }
  }

  /** An id no agent in the token's scope has: say so, and offer no control at all. */
  function missing(id) {
    agentId = id;
    parts = null;
    timeline = calls = runs = blotter = drill = null;
    replace(section,
      h("p", {}, h("a", {href: "#/overview"}, "← All agents")),
      h("h2", {id: "agent-title"}, id),
      h("p", {class: "error", id: "no-such-agent", role: "alert"},
        `No such agent: “${id}” is not an agent of this gateway that this token may see. Check the id, or pick an agent on the overview.`));
  }

  async function build(id) {
    agentId = id;
    generation += 1;
    const mine = generation;
    if (!await known(id)) {
      if (mine === generation) missing(id);
      return;
    }
    if (mine !== generation) return;
    stream = [];
    more = false;
    loaded = false;
    queue = null;
    const result = h("p", {class: "result", id: "control-result", role: "status"});
    const report = (r) => {
      result.textContent = r.text;
      result.className = `result ${r.kind || (r.ok ? "ok" : "bad")}`;
    };
    parts = {
      badge: stateBadge(ctx.model.agents.get(id)?.trading ?? ""), mode: h("span", {class: "tag"}), lane: h("span", {class: "tag"}),
      result,
      why: h("ul", {class: "why", id: "agent-why", "aria-label": "Why it is blocked, what it is doing"}),
      controlFacts: h("dl", {class: "facts"}), actions: h("ul", {class: "list", id: "control-actions", "aria-label": "Control actions and their results"}),
      laneFacts: h("dl", {class: "facts"}), run: h("div", {id: "active-run"}),
      pendingTitle: h("h4", {id: "pending-title"}), pending: h("div", {id: "pending"}),
      missing: h("p", {class: "error", hidden: true}),
      schedules: h("ul", {class: "list", id: "schedules", "aria-label": "Schedules"}),
    };
    timeline = createTimeline(ctx, id, {loadEarlier});
    calls = createCallTree(ctx, id);
    runs = createRunHistory(ctx, id);
    blotter = createAgentBlotter(ctx, id);
    drill = createDrill(ctx, id);
    const whatif = createWhatIf(ctx, id, {position: () => timeline.position()});
    timeline.el.append(whatif.el);
    const controls = ctx.controls ? h("div", {class: "controls", role: "toolbar", "aria-label": `Controls for ${id}`},
      h("span", {class: "who-for", "aria-hidden": "true"}, `${id}:`),
      Object.keys(ACTIONS).map((action) => ctx.controls.button(id, action, report))) : null;
    replace(section,
      h("p", {}, h("a", {href: "#/overview"}, "← All agents")),
      h("div", {class: "agent-head"}, h("h2", {id: "agent-title"}, id), parts.badge, parts.mode, parts.lane),
      parts.why,
      parts.missing, controls, controls ? result : null, createMessageBox(ctx, id), drill.el,
      h("div", {class: "lanes live"},
        h("section", {class: "card", "aria-labelledby": "control-lane-title"},
          h("h3", {id: "control-lane-title"}, "Control lane"), parts.controlFacts,
          h("h4", {}, "Actions and their results"), parts.actions),
        h("section", {class: "card", "aria-labelledby": "reasoning-lane-title"},
          h("h3", {id: "reasoning-lane-title"}, "Reasoning lane"), parts.laneFacts,
          h("h4", {}, "Active run"), parts.run, parts.pendingTitle, parts.pending,
          h("h4", {}, "Scheduled audits"), parts.schedules)),
      runs.el, blotter.el, calls.el, timeline.el);
    renderHead();  // what the model knows already, while the lanes and the log load
    return load(id, generation);
  }

  async function load(id, mine) {
    const path = `/api/agents/${encodeURIComponent(id)}`;
    try {
      const [page] = await Promise.all([ctx.api.get(`${path}/events`, {limit: PAGE}), refreshQueue()]);
      if (mine !== generation) return;
      stream = page.events.map((e) => ctx.model.entry(e));
      more = page.more;
      // Events that arrived live while the page was being read.
      for (const e of ctx.model.events) if (e.stream === id && e.version > (stream.at(-1)?.version ?? 0)) stream.push(e);
      loaded = true;
      timeline.set(stream, more);
      renderActions();
    } catch (error) {
      if (mine !== generation) return;
      parts.missing.hidden = false;
      parts.missing.textContent = `Cannot load ${id}: ${error.message}`;
    }
  }

  async function loadEarlier() {
    if (!stream.length) return;
    const mine = generation;
    const page = await ctx.api.get(`/api/agents/${encodeURIComponent(agentId)}/events`,
      {beforeVersion: stream[0].version, limit: PAGE});
    if (mine !== generation) return;
    const older = page.events.map((e) => ctx.model.entry(e));
    stream = [...older, ...stream];
    more = page.more;
    timeline.set(stream, more, older.length);
  }

  async function refreshQueue() {
    queueTimer = null;
    const id = agentId;
    try {
      const path = `/api/agents/${encodeURIComponent(id)}`;
      const [answer, found] = await Promise.all([ctx.api.get(`${path}/queue`), ctx.api.get(`${path}/schedules`)]);
      if (id !== agentId) return;
      queue = {...answer, _at: Date.now()};
      renderLanes();
      renderSchedules(found.schedules);
    } catch {
      // disconnected: the banner says so; the next event or tick tries again
    }
  }

  /** Back to this agent after another view: take the events that came meanwhile. */
  async function catchUp() {
    if (!loaded) return;
    const last = stream.at(-1)?.version ?? 0;
    const newer = ctx.model.events.filter((e) => e.stream === agentId && e.version > last);
    if (newer.length && newer[0].version !== last + 1) {
      await build(agentId);  // some fell out of the model's window: read the stream again
      return;
    }
    stream.push(...newer);
    timeline.set(stream, more);
    renderActions();
    scheduleQueue();
  }

  function scheduleQueue() {
    if (queueTimer === null) queueTimer = setTimeout(refreshQueue, QUEUE_REFRESH_MS);
  }

  function renderHead() {
    if (!parts) return;  // (no such agent)
    const a = ctx.model.agents.get(agentId);
    if (!a) {
      if (ctx.model.agents.size) {
        parts.missing.hidden = false;
        parts.missing.textContent = `No agent ${agentId} in this token's scope.`;
      }
      return;
    }
    parts.missing.hidden = true;
    const badge = badgeState(a);
    setState(parts.badge, badge);
    setAttr(parts.badge, "data-attention", attention(a));
    setAttr(parts.badge, "title", badge === a.trading ? null : `trading state ${a.trading}`);
    setText(parts.mode, `mode ${a.mode}`);
    setText(parts.lane, a.activeRun ? "busy" : "idle");
    renderWhy(a);
    const elapsed = Model.elapsed(a);
    replace(parts.controlFacts,
      h("dt", {}, "Trading"), h("dd", {}, a.trading),
      h("dt", {}, "Open orders"), h("dd", {}, String(a.openOrders)),
      h("dt", {}, "Controls applied"), h("dd", {}, String(a.counters.controls)),
      h("dt", {}, "Runs held"), h("dd", {}, a.held ?? "no"));
    replace(parts.laneFacts,
      h("dt", {}, "Mode"), h("dd", {}, a.mode),
      h("dt", {}, "Runs this hour"), h("dd", {}, budget(a.runsLastHour, a.budgets?.maxRunsPerHour)),
      h("dt", {}, "Runs today"), h("dd", {}, budget(a.runsLastDay, a.budgets?.maxRunsPerDay)),
      h("dt", {}, "Cooldown"), h("dd", {}, a.cooldownRemainingMs > elapsed ? duration(a.cooldownRemainingMs - elapsed) : "–"),
      h("dt", {}, "Aborts · drops · dedupes"), h("dd", {}, `${a.counters.aborts} · ${a.counters.drops} · ${a.counters.dedupes}`),
      h("dt", {}, "Budget suppressions"), h("dd", {id: "budget-suppressions"}, String(a.counters.suppressions)),
      h("dt", {}, "No-trade cooldowns"), h("dd", {id: "cooldowns"}, String(a.counters.cooldowns ?? 0)));
  }

  /** The reasons at the top, most severe first, coloured by what they mean. */
  function renderWhy(a) {
    const reasons = reasonsOf(a);
    const level = attention(a);
    setAttr(parts.why, "data-attention", level);
    parts.why.className = `why attention-${level}`;
    const items = reasons.length ? reasons.map((r) => [r.kind, reasonText(r, a)])
      : [["idle", a.pending ? `Idle · ${a.pending} pending` : "Idle: nothing blocks it"]];
    const current = [...parts.why.children];
    if (current.length === items.length && current.every((li, i) => li.dataset.kind === items[i][0])) {
      current.forEach((li, i) => setText(li, items[i][1]));  // durations tick: text only
    } else {
      replace(parts.why, items.map(([kind, text]) => h("li", {"data-kind": kind, class: `why-${kind}`}, text)));
    }
  }

  function renderLanes() {
    if (!queue) return;
    const elapsed = Model.elapsed(queue);
    const steers = queue.run ? stream.filter((e) => e.type === "RunSteered" && e.data.run_id === queue.run.runId) : [];
    replace(parts.run, runCard(queue.run, {elapsed, kinds: ctx.model.kinds, steers}));
    setText(parts.pendingTitle, `Pending, in order (${queue.pending.length})`);
    replace(parts.pending, pendingTable(queue.pending, {elapsed, id: "pending-table"}));
  }

  function renderSchedules(schedules) {
    if (!schedules.length) {
      replace(parts.schedules, h("li", {class: "muted"}, "No schedule."));
      return;
    }
    replace(parts.schedules, ...schedules.map((s) => h("li", {"data-schedule": s.id},
      h("strong", {}, s.id), " ",
      h("span", {class: "muted"}, `${s.cron ?? `every ${duration(s.everyMs)}`} (${s.timezone}) · ${s.priority} · catch-up ${s.catchUp}`),
      " → ",
      s.paused ? h("span", {class: "tag warn"}, "paused")
        : h("span", {class: "next-fire"}, `next ${when(s.nextFireAt)}`),
      h("span", {class: "muted"}, ` · last ${s.lastFireAt ? when(s.lastFireAt) : "never"} · fired ${s.fired}`))));
  }

  function renderActions() {
    const groups = controlActions(stream).slice(0, 100);
    if (!groups.length) {
      replace(parts.actions, h("li", {class: "muted"}, "No control action in the loaded log."));
      return;
    }
    replace(parts.actions, ...groups.map((g) => {
      const result = describeResult(g);
      return h("li", {"data-position": g.input.position},
        h("span", {class: "muted"}, `${clock(g.input.recordedAt)} · `), h("strong", {}, describeAction(g)), " → ",
        h("span", {class: result.ok ? "" : "error"}, result.text));
    }));
  }

  return {
    section,
    title: "Agent",
    async show(params) {
      if (params.id !== agentId) await build(params.id);
      else if (parts) await catchUp();
      if (!parts) return;  // (no such agent)
      renderHead();
      if (params.order) drill.order(params.order);
      else if (params.run) drill.run(params.run);
      else drill.close();
      if (params.at !== undefined) await timeline.travelTo(Number(params.at));
      timeline.redraw();
    },
    change(detail) {
      if (!agentId || !parts) return;
      let mine = false;
      if (loaded) {
        for (const e of detail.events) {
          if (e.stream === agentId && e.version > (stream.at(-1)?.version ?? 0)) {
            stream.push(e);
            mine = true;
          }
        }
      }
      // A call anywhere may be part of this agent's trees (its calls' calls are elsewhere).
      if (detail.events.some(isCallEvent)) calls?.refresh();
      runs?.seen(detail.events);
      blotter?.change(detail);
      if (mine) {
        timeline.set(stream, more);
        renderActions();
        scheduleQueue();
      }
      if (detail.agents) renderHead();
    },
    tick() {
      if (!parts) return;
      renderHead();
      renderLanes();
      blotter?.tick();
    },
  };
}
