// Time travel: one agent's stream as a timeline. Pick any event (slider, track, buttons or
// keys) and the queue is shown exactly as it was then, rebuilt by the gateway's replay API,
// with the decisions around that position.

import {h, keepingFocus, replace, setAttr, setText, stateBadge} from "../dom.js";
import {BAD_TYPES, CONTROL_TYPES, clock} from "../format.js";
import {Model} from "../model.js";
import {pendingTable, runCard} from "./queue.js";

const DEBOUNCE_MS = 120;
const AROUND = 8;
const PAD = 6;

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

export function createTimeline(ctx, agentId, {loadEarlier}) {
  let entries = [];
  let index = null;  // the picked event; null while following live
  let more = false;
  let seq = 0;
  let timer = null;
  const canvas = h("canvas", {class: "track", "aria-hidden": "true"});
  const slider = h("input", {type: "range", min: 0, max: 0, value: 0, step: 1, id: "travel-slider",
    "aria-label": `Log position of ${agentId}`, "aria-describedby": "travel-label"});
  const label = h("p", {id: "travel-label", class: "muted"});
  const earlier = h("button", {type: "button", id: "travel-earlier"}, "Load earlier events");
  const prev = h("button", {type: "button", id: "travel-prev"}, "◀ Previous input");
  const next = h("button", {type: "button", id: "travel-next"}, "Next input ▶");
  const live = h("button", {type: "button", id: "travel-live"}, "Back to live");
  const result = h("div", {id: "replay", class: "travel", "aria-live": "polite"});
  const el = h("section", {class: "timeline card", "aria-labelledby": "travel-title"},
    h("h3", {id: "travel-title"}, "Time travel"),
    h("p", {class: "muted"}, "Pick a position in this agent's log to see its queue exactly as it was then (rebuilt from the log by the gateway), with the decisions around it. Arrow keys step one event, Page Up/Down ten."),
    canvas, slider, label, h("div", {class: "toolbar"}, prev, next, live, earlier), result);

  slider.addEventListener("input", () => pick(Number(slider.value)));
  canvas.addEventListener("click", (event) => {
    if (!entries.length) return;
    const rect = canvas.getBoundingClientRect();
    const share = (event.clientX - rect.left - PAD) / Math.max(1, rect.width - 2 * PAD);
    pick(Math.round(Math.min(1, Math.max(0, share)) * (entries.length - 1)));
  });
  prev.addEventListener("click", () => step(-1));
  next.addEventListener("click", () => step(1));
  live.addEventListener("click", () => {
    index = null;
    seq += 1;
    update();
    replace(result, h("p", {class: "muted"}, "Following live. Pick a position to travel back."));
    delete result.dataset.position;
  });
  earlier.addEventListener("click", async () => {
    earlier.disabled = true;
    try { await loadEarlier(); } finally { earlier.disabled = false; }
  });
  result.append(h("p", {class: "muted"}, "Following live. Pick a position to travel back."));

  /** Move to the previous or next input (the start of the decisions it caused). */
  function step(direction) {
    if (!entries.length) return;
    let i = index === null ? entries.length - 1 : index;
    do { i += direction; } while (i > 0 && i < entries.length - 1 && !entries[i].input);
    pick(Math.min(entries.length - 1, Math.max(0, i)));
  }

  function pick(i) {
    index = i;
    update();
    clearTimeout(timer);
    const position = entries[i].position;
    timer = setTimeout(() => show(position), DEBOUNCE_MS);
  }

  async function show(position) {
    const mine = ++seq;
    let answer;
    try {
      answer = await ctx.api.get("/api/replay", {agent: agentId, position, around: AROUND});
    } catch (error) {
      if (mine === seq) replace(result, h("p", {class: "error"}, `Replay failed: ${error.message}`));
      return;
    }
    if (mine !== seq) return;  // a later pick is on its way
    render(answer);
  }

  function render(answer) {
    const queue = answer.queue;
    const around = answer.around.map((raw) => ctx.model.entry(raw));
    result.dataset.position = answer.position;
    keepingFocus(result, () => replace(result,
      h("div", {},
        h("h4", {}, `Queue as at position ${answer.position} (${clock(answer.at)})`),
        h("dl", {class: "facts"},
          h("dt", {}, "Trading"), h("dd", {}, stateBadge(answer.status.trading)),
          h("dt", {}, "Lane"), h("dd", {}, queue.busy ? "busy" : "idle"),
          h("dt", {}, "Stream version"), h("dd", {}, String(answer.version))),
        runCard(queue.run, {kinds: ctx.model.kinds}),
        h("h4", {}, `Pending then (${queue.pending.length})`),
        pendingTable(queue.pending, {id: "replay-pending", label: `Pending requests at position ${answer.position}`})),
      h("div", {},
        h("h4", {}, "Inputs and decisions around it"),
        h("ul", {class: "list around", "aria-label": "Events around the position"}, around.map((e) => {
          const li = h("li", {"aria-current": e.position === answer.eventPosition ? "true" : null,
            tabindex: 0, role: "button", "data-position": e.position, "data-focus-key": e.position},
            h("span", {class: "mono"}, e.position), h("span", {}, e.type), h("span", {class: "muted"}, Model.summary(e)));
          const go = () => {
            const i = entries.findIndex((x) => x.position === e.position);
            if (i >= 0) pick(i);
          };
          li.addEventListener("click", go);
          li.addEventListener("keydown", (k) => { if (k.key === "Enter" || k.key === " ") { k.preventDefault(); go(); } });
          return li;
        })))));
  }

  function update() {
    const n = entries.length;
    slider.max = Math.max(0, n - 1);
    slider.disabled = n === 0;
    slider.value = index === null ? n - 1 : index;
    earlier.hidden = !more;
    live.disabled = index === null;
    if (!n) {
      setText(label, "No events yet.");
    } else if (index === null) {
      setText(label, `Live · ${n} events loaded (positions ${entries[0].position}–${entries[n - 1].position})`);
    } else {
      const e = entries[index];
      setText(label, `Position ${e.position} · event ${index + 1} of ${n} · ${clock(e.recordedAt)} · ${e.type}`);
    }
    const e = entries[index ?? n - 1];
    setAttr(slider, "aria-valuetext", e ? `position ${e.position}, ${e.type}, ${clock(e.recordedAt)}` : "no events");
    draw();
  }

  function draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width) return;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, width, height);
    const n = entries.length;
    const x = (i) => (n <= 1 ? width / 2 : PAD + (i * (width - 2 * PAD)) / (n - 1));
    const colours = {input: css("--input"), bad: css("--bad"), control: css("--control"),
      good: css("--good"), decision: css("--decision")};
    for (let i = 0; i < n; i++) {
      const e = entries[i];
      const colour = e.input ? colours.input : BAD_TYPES.has(e.type) ? colours.bad
        : CONTROL_TYPES.has(e.type) ? colours.control : e.type === "RunStarted" ? colours.good : colours.decision;
      g.fillStyle = colour;
      const tall = e.input ? 0.35 : 0.7;
      g.fillRect(Math.round(x(i)), height * (1 - tall) - 4, 1.5, height * tall);
    }
    if (n) {
      g.fillStyle = css("--accent");
      g.fillRect(x(index ?? n - 1) - 1.5, 0, 3, height);
    }
  }

  return {
    el,
    /** The whole loaded stream (oldest first), whether there is more before it, and how
     * many of its events were just put in front (loaded earlier). */
    set(list, hasMore, prepended = 0) {
      if (index !== null) index += prepended;
      entries = list;
      more = hasMore;
      update();
    },
    /** Pick the event at or just before a log position (deep links: #/agent/ID?at=P). */
    async travelTo(position) {
      for (let page = 0; page < 20 && more && entries.length && entries[0].position > position; page++) {
        await loadEarlier();
      }
      let i = -1;
      for (let j = 0; j < entries.length && entries[j].position <= position; j++) i = j;
      if (i >= 0) pick(i);
    },
    redraw: draw,
  };
}
