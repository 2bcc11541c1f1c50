// Live event log: newest first, filtered by agent, type, request kind and class; times for
// people (local, with the date when not today, and how long ago); one-line summaries of
// orders and broker reports. A text search asks the gateway to search the whole log
// (GET /api/events?q=), not only the events this page holds, a page at a time back from the
// newest; live events that match join the results. Virtualised (only the rows in view are in
// the DOM). Pick an event to see its full data, the input that caused it and every decision
// made of that input.

import {h, replace, setAttr, setText} from "../dom.js";
import {BAD_TYPES, CONTROL_TYPES, age, clock, num, when} from "../format.js";
import {Model} from "../model.js";

const KINDS = ["user_control", "hook_trigger", "scheduled_audit", "system_alert", "agent_call"];
const OVERSCAN = 8;
const SEARCH_PAGE = 200;

export function createEvents(ctx) {
  const section = document.getElementById("events-view");
  const agent = h("select", {id: "log-agent"});
  const type = h("select", {id: "log-type"});
  const kind = h("select", {id: "log-kind"}, h("option", {value: ""}, "any kind"), KINDS.map((k) => h("option", {value: k}, k)));
  const cls = h("select", {id: "log-class"}, h("option", {value: ""}, "inputs and decisions"),
    h("option", {value: "input"}, "inputs only"), h("option", {value: "decision"}, "decisions only"));
  const search = h("input", {type: "search", id: "log-search", placeholder: "text anywhere in the log…"});
  const count = h("p", {class: "summary", id: "log-count", "aria-live": "off"});
  const older = h("button", {type: "button", class: "small", id: "log-older", hidden: true}, "Search further back");
  const sizer = h("div", {style: "position: relative"});
  const list = h("div", {class: "events live", id: "event-list", role: "listbox", tabindex: 0,
    "aria-label": "Events, newest first"}, sizer);
  const detail = h("aside", {class: "card detail", id: "event-detail", "aria-labelledby": "event-detail-title"},
    h("h3", {id: "event-detail-title"}, "Event"), h("p", {class: "muted"}, "Pick an event to see its data and the input that caused it."));
  replace(section,
    h("h2", {id: "events-title"}, "Event log"),
    h("div", {class: "toolbar", role: "search", "aria-label": "Filter events"},
      h("label", {for: "log-agent"}, "Agent"), agent, h("label", {for: "log-type"}, "Type"), type,
      h("label", {for: "log-kind"}, "Kind"), kind, h("label", {for: "log-class"}, "Class"), cls,
      h("label", {for: "log-search"}, "Search"), search),
    h("div", {class: "log-count"}, count, older), h("div", {class: "log"}, list, detail));

  let matches = [];  // entries that pass the filters, oldest first
  let rowHeight = 34;
  let active = null;  // position of the active (keyboard) event
  let rows = new Map();
  let typesSeen = 0;
  let agentsSeen = -1;
  let searchTimer = null;
  let detailSeq = 0;
  let remote = null;  // a search of the whole log: {key, text, events (oldest first), before, scanned, loading, live, top}
  let searchSeq = 0;

  for (const input of [agent, type, kind, cls]) input.addEventListener("input", refilter);
  search.addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(refilter, 250); });
  older.addEventListener("click", searchOlder);
  list.addEventListener("scroll", () => render(), {passive: true});
  list.addEventListener("keydown", onKey);

  function options() {
    if (agentsSeen !== ctx.model.agents.size) {
      agentsSeen = ctx.model.agents.size;
      const value = agent.value;
      replace(agent, h("option", {value: ""}, "all agents"),
        [...ctx.model.agents.keys()].sort().map((id) => h("option", {value: id}, id)));
      agent.value = value;
    }
    if (typesSeen !== ctx.model.types.size) {
      typesSeen = ctx.model.types.size;
      const value = type.value;
      replace(type, h("option", {value: ""}, "any type"), [...ctx.model.types].sort().map((t) => h("option", {value: t}, t)));
      type.value = value;
    }
  }

  function passes(e) {
    if (agent.value && e.stream !== agent.value && e.data.agent_id !== agent.value) return false;
    if (type.value && e.type !== type.value) return false;
    if (kind.value && e.kind !== kind.value) return false;
    if (cls.value && (cls.value === "input") !== e.input) return false;
    const text = search.value.trim().toLowerCase();
    return !text || Model.searchText(e).includes(text);
  }

  /** The filters the gateway does not apply to a search of the whole log. */
  function passesHere(e) {
    if (kind.value && e.kind !== kind.value) return false;
    return !cls.value || (cls.value === "input") === e.input;
  }

  function refilter() {
    const text = search.value.trim();
    if (text) {
      startSearch(text);
      matches = remote.loading ? ctx.model.events.filter(passes) : remote.events.filter(passesHere);
    } else {
      remote = null;
      searchSeq += 1;
      matches = ctx.model.events.filter(passes);
    }
    list.scrollTop = 0;
    render();
  }

  async function ask(params) {
    const answer = await ctx.api.get("/api/events", {q: remote.text, agent: agent.value, type: type.value,
      limit: SEARCH_PAGE, ...params});
    return {events: answer.events.map((e) => ctx.model.entry(e)).reverse(), before: answer.before, scanned: answer.scanned};
  }

  /** Search the whole log (newest first) unless the same search is shown already. */
  async function startSearch(text) {
    const key = JSON.stringify([text, agent.value, type.value]);
    if (remote && remote.key === key) return;
    const mine = ++searchSeq;
    remote = {key, text, events: [], before: null, scanned: 0, loading: true, live: [], top: 0};
    try {
      const page = await ask({});
      if (mine !== searchSeq) return;
      const top = page.events.at(-1)?.position ?? 0;
      remote = {...remote, ...page, loading: false, top,
        events: [...page.events, ...remote.live.filter((e) => e.position > top)]};
    } catch (error) {
      if (mine !== searchSeq) return;
      remote = {...remote, loading: false, error: error.message};
    }
    matches = remote.events.filter(passesHere);
    list.scrollTop = 0;
    render();
  }

  async function searchOlder() {
    if (!remote || remote.before === null || remote.loading) return;
    const mine = searchSeq;
    older.disabled = true;
    try {
      const page = await ask({before: remote.before});
      if (mine !== searchSeq) return;
      remote.events = [...page.events, ...remote.events];
      remote.before = page.before;
      remote.scanned += page.scanned;
      matches = [...page.events.filter(passesHere), ...matches];
      render();
    } catch (error) {
      if (mine === searchSeq) setText(count, `Cannot search further back: ${error.message}`);
    } finally {
      older.disabled = false;
    }
  }

  function countText() {
    if (!remote) return `${num(matches.length)} of ${num(ctx.model.events.length)} events in memory match · newest first`;
    const what = `“${remote.text}”`;
    if (remote.loading) return `Searching the whole log for ${what}…`;
    if (remote.error) return `Cannot search the log: ${remote.error}`;
    return `${num(matches.length)} event${matches.length === 1 ? "" : "s"} in the whole log match ${what} · newest first · `
      + (remote.before === null ? "searched back to the start of the log" : `searched back to position ${num(remote.before)}`);
  }

  /** The entry shown at row `i` (row 0 is the newest). */
  const at = (i) => matches[matches.length - 1 - i];

  function render() {
    const n = matches.length;
    sizer.style.height = `${n * rowHeight}px`;
    setText(count, countText());
    older.hidden = !remote || remote.loading || remote.before === null;
    const first = Math.max(0, Math.floor(list.scrollTop / rowHeight) - OVERSCAN);
    const last = Math.min(n, Math.ceil((list.scrollTop + (list.clientHeight || 600)) / rowHeight) + OVERSCAN);
    const wanted = new Map();
    for (let i = first; i < last; i++) {
      const e = at(i);
      let row = rows.get(e.position);
      if (!row) row = makeRow(e);
      row.style.top = `${i * rowHeight}px`;
      setAttr(row, "aria-selected", e.position === active ? "true" : "false");
      setAttr(row, "aria-posinset", i + 1);
      setAttr(row, "aria-setsize", n);
      if (!row.isConnected) sizer.append(row);
      wanted.set(e.position, row);
    }
    for (const [position, row] of rows) if (!wanted.has(position)) row.remove();
    rows = wanted;
    setAttr(list, "aria-activedescendant", active !== null && rows.has(active) ? `ev-${active}` : null);
  }

  function makeRow(e) {
    const tone = BAD_TYPES.has(e.type) ? " bad" : CONTROL_TYPES.has(e.type) ? " control" : "";
    const row = h("div", {class: `row ${e.input ? "input" : "decision"}${tone}`, role: "option", id: `ev-${e.position}`,
      "data-position": e.position, "data-type": e.type, "data-stream": e.stream},
      h("span", {class: "mono"}, e.position),
      h("span", {class: "when", title: `${new Date(e.recordedAt).toString()} (${clock(e.recordedAt)})`},
        when(e.recordedAt), h("span", {class: "muted age", "data-at": e.recordedAt}, ` · ${age(e.recordedAt)}`)),
      h("span", {}, e.stream), h("span", {class: "type"}, e.type), h("span", {class: "muted what"}, Model.summary(e)));
    row.addEventListener("click", () => select(e.position));
    return row;
  }

  function indexOf(position) {
    // matches is sorted by position: binary search, then convert to a row index
    let lo = 0;
    let hi = matches.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (matches[mid].position === position) return matches.length - 1 - mid;
      if (matches[mid].position < position) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
  }

  function reveal(i) {
    const top = i * rowHeight;
    if (top < list.scrollTop) list.scrollTop = top;
    else if (top + rowHeight > list.scrollTop + list.clientHeight) list.scrollTop = top + rowHeight - list.clientHeight;
  }

  function onKey(event) {
    if (!matches.length) return;
    const current = active === null ? -1 : indexOf(active);
    const page = Math.max(1, Math.floor(list.clientHeight / rowHeight) - 1);
    const moves = {ArrowDown: current + 1, ArrowUp: current - 1, PageDown: current + page, PageUp: current - page,
      Home: 0, End: matches.length - 1};
    if (event.key in moves) {
      event.preventDefault();
      const i = Math.min(matches.length - 1, Math.max(0, moves[event.key]));
      active = at(i).position;
      reveal(i);
      render();
    } else if ((event.key === "Enter" || event.key === " ") && active !== null) {
      event.preventDefault();
      select(active);
    }
  }

  async function select(position) {
    active = position;
    const i = indexOf(position);
    if (i >= 0) reveal(i);
    render();
    const mine = ++detailSeq;
    replace(detail, h("h3", {id: "event-detail-title"}, `Event ${position}`), h("p", {class: "muted"}, "Loading…"));
    // On a narrow screen the detail is under the list, below the fold: bring it into view.
    if (detail.getBoundingClientRect().top >= list.getBoundingClientRect().bottom - 1) {
      detail.scrollIntoView({block: "start"});
    }
    let answer;
    try {
      answer = await ctx.api.get(`/api/events/${position}`);
    } catch (error) {
      if (mine === detailSeq) replace(detail, h("h3", {id: "event-detail-title"}, `Event ${position}`), h("p", {class: "error"}, error.message));
      return;
    }
    if (mine !== detailSeq) return;
    showDetail(ctx.model.entry(answer.event), answer);
  }

  function eventLink(e, current) {
    const button = h("button", {type: "button", class: "small", "aria-current": e.position === current ? "true" : null},
      `${e.position} ${e.type}`);
    button.addEventListener("click", () => select(e.position));
    return h("li", {}, button, " ", h("span", {class: "muted"}, Model.summary(e)));
  }

  function showDetail(e, answer) {
    const input = answer.input ? ctx.model.entry(answer.input) : null;
    const decisions = answer.decisions.map((d) => ctx.model.entry(d));
    const agentStream = !e.provider;
    replace(detail,
      h("h3", {id: "event-detail-title"}, `Event ${e.position}: ${e.type}`),
      h("dl", {class: "facts"},
        h("dt", {}, "Stream"), h("dd", {}, agentStream ? h("a", {href: `#/agent/${encodeURIComponent(e.stream)}`}, e.stream) : e.stream),
        h("dt", {}, "Version"), h("dd", {}, String(e.version)),
        h("dt", {}, "Recorded"), h("dd", {}, `${when(e.recordedAt)} (${clock(e.recordedAt)}) · ${age(e.recordedAt)}`),
        h("dt", {}, "Class"), h("dd", {}, e.input ? "input (a fact from outside)" : "decision"),
        h("dt", {}, "Request kind"), h("dd", {}, e.kind ?? "–")),
      agentStream ? h("p", {}, h("a", {href: `#/agent/${encodeURIComponent(e.stream)}?at=${e.position}`, id: "travel-here"},
        "Time travel to this position")) : null,
      h("h4", {}, "Data"), h("pre", {id: "event-data"}, JSON.stringify(e.data, null, 2)),
      h("h4", {}, e.input ? "This event is the input" : "Caused by the input"),
      input ? h("div", {id: "event-cause", "data-position": input.position},
        h("p", {}, h("strong", {}, `${input.position} ${input.type}`), " ", h("span", {class: "muted"}, Model.summary(input))),
        input.position === e.position ? null : h("pre", {}, JSON.stringify(input.data, null, 2)))
        : h("p", {class: "muted", id: "event-cause"}, "No input before it in its stream."),
      h("h4", {}, `Decisions made of that input (${decisions.length}${answer.truncated ? "+" : ""})`),
      decisions.length ? h("ul", {class: "list", id: "event-decisions"}, decisions.map((d) => eventLink(d, e.position)))
        : h("p", {class: "muted"}, "None."));
  }

  return {
    section,
    title: "Event log",
    show(params) {
      options();
      if (params.agent !== undefined) agent.value = params.agent;
      refilter();
      if (params.position !== undefined) select(Number(params.position));
      const probe = rows.values().next().value;
      const measured = probe?.getBoundingClientRect().height;
      if (measured && Math.abs(measured - rowHeight) > 0.5) {
        rowHeight = measured;
        render();
      }
    },
    change(detail) {
      options();
      if (detail.reset) { refilter(); return; }
      let added = 0;
      for (const e of detail.events) {
        if (!passes(e)) continue;
        if (remote?.loading) {
          remote.live.push(e);  // taken in once the search answers (if it is newer)
          continue;
        }
        if (remote && e.position <= remote.top) continue;
        if (remote) remote.events.push(e);
        matches.push(e);
        added += 1;
      }
      const oldest = ctx.model.events[0]?.position ?? 0;
      if (!remote && matches.length && matches[0].position < oldest) {
        const keep = matches.findIndex((e) => e.position >= oldest);
        matches.splice(0, keep < 0 ? matches.length : keep);
      }
      if (added && list.scrollTop > 0) list.scrollTop += added * rowHeight;  // keep what is in view still
      if (added || detail.reset) render();
      else setText(count, countText());
    },
    tick() {
      const now = Date.now();
      for (const span of sizer.querySelectorAll(".age")) setText(span, ` · ${age(Number(span.dataset.at), now)}`);
    },
  };
}
