// Pieces shared by the live reasoning lane and the time-travel view: the active run and the
// pending list, each request with its kind, priority, age and dedupe key.

import {h} from "../dom.js";
import {clock, duration} from "../format.js";

/** The pending list in order, as a table (ages advanced by `elapsed` ms). */
export function pendingTable(pending, {elapsed = 0, label = "Pending requests", id = null} = {}) {
  if (!pending.length) return h("p", {class: "muted", id, "data-count": 0}, "No pending request.");
  return h("table", {class: "plain", id, "aria-label": label, "data-count": pending.length},
    h("thead", {}, h("tr", {},
      ["#", "Request", "Kind", "Priority", "Mode", "Age", "Dedupe key"].map((c) => h("th", {scope: "col"}, c)))),
    h("tbody", {}, pending.map((p, i) => h("tr", {"data-request-id": p.requestId},
      h("td", {class: "num"}, i + 1), h("td", {class: "mono"}, p.requestId), h("td", {}, p.kind),
      h("td", {}, h("span", {class: p.priority === "high" ? "tag warn" : "tag"}, p.priority)),
      h("td", {}, p.mode), h("td", {class: "num"}, duration(p.ageMs + elapsed)),
      h("td", {class: "mono"}, p.dedupeKey ?? "–")))));
}

/** The active run: its id, the requests it holds, steers received, elapsed time. */
export function runCard(run, {elapsed = 0, kinds = new Map(), steers = []} = {}) {
  if (!run) return h("div", {class: "run none"}, "Idle: no run is active.");
  return h("div", {class: "run", "data-run-id": run.runId},
    h("dl", {class: "facts"},
      h("dt", {}, "Run"), h("dd", {class: "mono"}, run.runId),
      h("dt", {}, "Elapsed"), h("dd", {}, duration(run.durationMs + elapsed)),
      h("dt", {}, "Started"), h("dd", {}, clock(run.startedAt)),
      h("dt", {}, "Deadline"), h("dd", {}, clock(run.deadline)),
      h("dt", {}, "Steerable"), h("dd", {}, run.steerable ? "yes" : "no"),
      h("dt", {}, "Steers received"), h("dd", {}, String(run.steers))),
    h("h4", {}, `Requests it holds (${run.requests.length})`),
    h("ul", {class: "list"}, run.requests.map((id) => h("li", {},
      h("span", {class: "mono"}, id), kinds.get(id) ? [" ", h("span", {class: "tag"}, kinds.get(id))] : null))),
    steers.length ? h("h4", {}, "Steers") : null,
    steers.length ? h("ul", {class: "list"}, steers.map((s) => h("li", {},
      `${clock(s.recordedAt)} · `, h("span", {class: "mono"}, s.data.request_id)))) : null);
}
