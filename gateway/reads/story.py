"""Time travel as a story, for the panel: an agent's stream grouped by input and worded as
the CLI timeline words it (`gateway.tools.timeline.story`), the agent's budgets, cooldown, holds
and provider gate at one position, and what changed between two positions.

Everything here is a view of states replayed from the log (`lanes`); nothing is sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field

from gateway.base.quarantine import LogReader
from gateway.market.prices import PriceWords
from gateway.tools.timeline import JUMP_KINDS, Group
from gateway.tools.timeline import story as story_of
from lanes import AgentState, status
from lanes.events import INPUT_TYPES, TradingState
from lanes.gate import (
    GateState,
    Waiting,
    blocker,
    fair_hold,
    gate_status,
    next_gate_due,
)
from lanes.requests import WireModel
from store.port import RecordedEvent

__all__ = ["INPUT_NAMES", "JUMP_KINDS", "RESPONSES", "DiffJson", "FoundJson", "Group",
           "MomentJson", "StoryJson", "answer", "diff_json", "gate_json", "group_json",
           "moment_json", "read_type", "story_of", "told"]


# ------------------------------------------------------------------- the answers' shapes
# Pydantic models of what the story routes answer: the OpenAPI document is made from them,
# and every answer is checked against them before it goes out (`answer`).


class SaidJson(WireModel):
    """A decision as the CLI timeline words it, with its kinds (`kinds_of`)."""

    position: int
    type: str
    text: str
    kinds: list[str]


class GroupJson(WireModel):
    """An input (worded as the CLI timeline words it) and the decisions it caused."""

    position: int
    at: int
    type: str
    text: str
    kinds: list[str]
    decisions: list[SaidJson]


class StoryJson(WireModel):
    """`GET /api/agents/{id}/story`: the groups around ``at`` (``index`` is the one holding
    it, -1 if none), or those in [``from``, ``to``] (``more``: the limit left some out)."""

    agent_id: str
    groups: list[GroupJson]
    more: bool
    at: int | None = None
    index: int | None = None
    from_: int | None = Field(default=None, alias="from")
    to: int | None = None


class FoundJson(WireModel):
    """`GET /api/agents/{id}/story/find`: where the next or previous one is (null: none)."""

    agent_id: str
    kind: str
    position: int | None


class BudgetsNow(WireModel):
    """Runs against their budgets, and the no-trade cooldown."""

    runs_last_hour: int
    max_runs_per_hour: int | None
    runs_last_day: int
    max_runs_per_day: int | None
    cooldown_remaining_ms: int
    cooldown_until: int | None
    no_trade_cooldown_ms: int


class SuppressedNow(WireModel):
    """Runs held back by a budget (``hourly``, ``daily`` or ``cooldown``) until when."""

    reason: str
    until: int


class RunNow(WireModel):
    """The active run."""

    run_id: str
    started_at: int
    duration_ms: int
    requests: list[str]


class PendingNow(WireModel):
    """A pending request."""

    request_id: str
    kind: str
    priority: str
    age_ms: int


class OrderNow(WireModel):
    """An open order."""

    order_id: str
    symbol: str
    side: str
    qty: float
    filled: float
    cancel_requested: bool
    flatten: bool = False
    """An operator's flatten placed it, not the agent."""


class GateWait(WireModel):
    """A call of the agent's waiting at the gate, and what keeps it back."""

    run_id: str
    priority: str
    since: int
    waited_ms: int
    tokens: int
    why: str


class GateLease(WireModel):
    """A slot the agent's call holds."""

    run_id: str
    granted_at: int
    deadline: int


class GateView(WireModel):
    """What the agent's provider gate held for it; ``note`` says how that is known, or why
    nothing more is said (the rest is then null)."""

    provider: str | None
    note: str
    waiting: tuple[GateWait, ...] = ()
    in_flight: tuple[GateLease, ...] = ()
    version: int | None = None
    at: int | None = None
    others_waiting: int | None = None
    in_flight_all: int | None = None
    window_requests: int | None = None
    requests_per_minute: int | None = None
    max_concurrent: int | None = None
    breaker: str | None = None
    next_decision_at: int | None = None


class MomentJson(WireModel):
    """`GET /api/agents/{id}/moment`: the agent replayed to ``position`` (its last event
    folded: ``eventPosition``)."""

    agent_id: str
    position: int
    event_position: int
    version: int
    at: int
    trading: str
    lane: str
    why: str
    budgets: BudgetsNow
    suppressed: SuppressedNow | None
    held: str | None
    run: RunNow | None
    pending: list[PendingNow]
    orders: list[OrderNow]
    positions: dict[str, float]
    gate: GateView | None


class FactChange(WireModel):
    """A fact that differs between the two positions."""

    what: str
    before: str | int
    after: str | int


class PendingChange(WireModel):
    """Requests pending at the second position and not the first, and the other way."""

    added: list[str]
    removed: list[str]


class OrderChange(WireModel):
    """An order opened, closed or changed (filled, cancel asked) between the positions."""

    order_id: str
    change: str
    symbol: str
    side: str
    qty: float
    filled: float
    filled_before: float | None = None
    cancel_requested: bool | None = None
    flatten: bool = False
    """An operator's flatten placed it, not the agent."""


class PositionChange(WireModel):
    """A symbol's position at each end."""

    symbol: str
    before: float
    after: float


class DiffEnd(WireModel):
    """One end of a diff: the position asked, the last event folded, the stream version and
    the agent's time there."""

    position: int
    event_position: int
    version: int
    at: int


class DiffJson(WireModel):
    """`GET /api/agents/{id}/diff`: what changed from ``from`` to ``to``."""

    agent_id: str
    from_: DiffEnd = Field(alias="from")
    to: DiffEnd
    changes: list[FactChange]
    pending: PendingChange
    orders: list[OrderChange]
    positions: list[PositionChange]


RESPONSES: dict[str, type[WireModel]] = {
    "StoryJson": StoryJson, "FoundJson": FoundJson, "MomentJson": MomentJson,
    "DiffJson": DiffJson}
"""The story routes' answers by name, for the OpenAPI document."""


def answer(shape: type[WireModel], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` checked against the shape the OpenAPI document gives it (a mismatch is a bug
    here, never the client's: it raises), as JSON with its nulls."""
    checked: dict[str, Any] = shape.model_validate(body).model_dump(mode="json")
    return checked


GATE_NOTE = (
    "the provider gate as its own log had it at this position (its latest event at or "
    "before it); its per-minute windows are counted at that event's time"
)


def group_json(group: Group) -> dict[str, Any]:
    """A `Group` as JSON: the input's words and each decision's, as the CLI prints them."""
    return {"position": group.position, "at": group.at, "type": group.type,
            "text": group.text, "kinds": list(group.kinds),
            "decisions": [{"position": s.position, "type": s.type, "text": s.text,
                           "kinds": list(s.kinds)} for s in group.decisions]}


Span = tuple[int, int]
"""Where one group lies in a stream's records: [start, end) indexes."""
INPUT_NAMES = frozenset(t.__name__ for t in INPUT_TYPES)


def read_type(record: RecordedEvent, reader: LogReader) -> str:
    """A record's event type as it is read (a stand-in's if it was set aside)."""
    found = reader.replacements.get(record.position)
    return record.type if found is None else found[0]


def told(records: Sequence[RecordedEvent], chosen: Iterable[Span], reader: LogReader,
         words: PriceWords | None = None) -> list[Group]:
    """The groups of these spans, decoded and worded (`gateway.tools.timeline.story`; prices
    to the ticks of ``words``)."""
    return [group for start, end in chosen
            for group in story_of(reader.entries(records[start:end]), words)]


def why_waiting(state: AgentState) -> str:
    """Why no run starts now, in a few words, or what the lane is doing."""
    view = status(state, state.now)
    if state.active is not None:
        return f"running {state.active.run_id}"
    if view.trading is TradingState.HALTED:
        return "halted: no run starts until a resume"
    if state.held is not None:
        return f"held until a resume: {state.held}"
    if state.suppressed is not None:
        return f"runs suppressed ({state.suppressed[0]}) until the budget allows them"
    if view.cooldown_remaining_ms:
        return f"cooling down for {view.cooldown_remaining_ms} ms"
    if state.collect_due is not None:
        return "collecting requests until the window closes"
    return "idle, waiting for work" if not state.pending else "idle"


def moment_json(state: AgentState, gate: dict[str, Any] | None, position: int,
                event_position: int) -> dict[str, Any]:
    """An agent at one position: trading, lane, budgets against their limits, cooldown,
    suppression, hold, pending list, orders, positions, and the provider gate's view."""
    now = state.now
    view = status(state, now)
    budgets = state.config.budgets
    run = state.active
    return {
        "agentId": state.agent_id, "position": position, "eventPosition": event_position,
        "version": state.version, "at": now,
        "trading": view.trading.value, "lane": view.lane.value, "why": why_waiting(state),
        "budgets": {
            "runsLastHour": view.runs_last_hour, "maxRunsPerHour": budgets.max_runs_per_hour,
            "runsLastDay": view.runs_last_day, "maxRunsPerDay": budgets.max_runs_per_day,
            "cooldownRemainingMs": view.cooldown_remaining_ms,
            "cooldownUntil": state.cooldown_until if view.cooldown_remaining_ms else None,
            "noTradeCooldownMs": budgets.no_trade_cooldown_ms,
        },
        "suppressed": None if state.suppressed is None else {
            "reason": state.suppressed[0], "until": state.suppressed[1]},
        "held": state.held,
        "run": None if run is None else {
            "runId": run.run_id, "startedAt": run.started_at,
            "durationMs": max(0, now - run.started_at),
            "requests": [p.request.request_id for p in run.requests]},
        "pending": [{"requestId": p.request.request_id, "kind": p.request.kind.value,
                     "priority": p.request.priority.value, "ageMs": max(0, now - p.at)}
                    for p in state.pending],
        "orders": [{"orderId": o.order_id, "symbol": o.intent.symbol, "side": o.intent.side,
                    "qty": o.intent.qty, "filled": o.filled_qty,
                    "cancelRequested": o.cancel_requested, "flatten": not o.run_id}
                   for o in state.orders.values()],
        "positions": dict(sorted(state.positions.items())),
        "gate": gate,
    }


def gate_json(agent_id: str, provider: str | None, gate: GateState | None) -> dict[str, Any]:
    """What a provider gate (folded up to a position; None: not folded, as the agent had no
    active run) holds for one agent: its calls waiting (since when, and what keeps each
    back: a limit, the breaker, a backoff, the fair order), its calls in flight, and when
    the gate next decides something."""
    if provider is None:
        return {"provider": None, "note": "this agent's runs go through no provider gate"}
    if gate is None:
        return {"provider": provider, "waiting": [], "inFlight": [],
                "note": "no run of this agent was active, so none of its calls was at the "
                        "gate"}
    if gate.version == 0:
        return {"provider": provider, "note": "the provider gate had no events yet",
                "waiting": [], "inFlight": []}
    now = gate.now
    mine = [w for w in gate.waiting.values() if w.agent_id == agent_id]
    view = gate_status(gate, now)
    due = next_gate_due(gate, now)
    return {
        "provider": provider, "note": GATE_NOTE, "version": gate.version, "at": now,
        "waiting": [_waiting_json(gate, w) for w in sorted(mine, key=lambda w: w.seq)],
        "inFlight": [{"runId": lease.run_id, "grantedAt": lease.granted_at,
                      "deadline": lease.deadline}
                     for lease in gate.leases.values() if lease.agent_id == agent_id],
        "othersWaiting": sum(1 for w in gate.waiting.values() if w.agent_id != agent_id),
        "inFlightAll": view.in_flight,
        "windowRequests": view.window_requests,
        "requestsPerMinute": view.limits.requests_per_minute,
        "maxConcurrent": view.limits.max_concurrent,
        "breaker": view.breaker.value,
        "nextDecisionAt": due,
    }


def _waiting_json(gate: GateState, entry: Waiting) -> dict[str, Any]:
    why = blocker(gate, entry) or fair_hold(gate, entry) or \
        "within every limit: granted at the gate's next decision"
    return {"runId": entry.run_id, "priority": entry.priority.value,
            "since": entry.queued_at, "waitedMs": max(0, gate.now - entry.queued_at),
            "tokens": entry.tokens, "why": why}


# -------------------------------------------------------------------------------- diff


COUNTER_NAMES = {
    "received": "requests received", "accepted": "requests accepted",
    "repeats": "repeated request ids", "dedupes": "requests deduped",
    "drops": "requests dropped", "summarized": "requests summarized",
    "rejected": "requests rejected", "fallbacks": "mode fallbacks",
    "controls": "controls applied", "runs": "runs started", "completed": "runs completed",
    "failed": "runs failed", "aborts": "runs aborted", "steers": "requests steered into runs",
    "suppressions": "budget suppressions", "cooldowns": "no-trade cooldowns",
    "holds": "runs held for spend", "orders_accepted": "orders accepted",
    "orders_rejected": "orders rejected", "calls_dispatched": "sub-agent calls sent",
    "calls_rejected": "sub-agent calls refused", "input_tokens": "input tokens used",
    "output_tokens": "output tokens used",
}
"""The agent's counters (`lanes.state.Counters`) as a person names them."""
HELD_BACK_BY = {"hourly": "runs per hour budget", "daily": "runs per day budget",
                "cooldown": "no-trade cooldown", "tokens": "desk token budget",
                "spend": "desk spend budget", "desk": "desk budget"}
"""What holds runs back (a `RunsSuppressed` reason), in words."""


def _facts(state: AgentState) -> dict[str, str | int]:
    """What a person compares between two moments of one agent, by label."""
    view = status(state, state.now)
    config = state.config
    budgets = config.budgets
    held_back = None if state.suppressed is None else state.suppressed[0]
    facts: dict[str, str | int] = {
        "trading": view.trading.value,
        "lane": "idle" if state.active is None else f"running {state.active.run_id}",
        "held": state.held or "no",
        "runs held back until": "no" if state.suppressed is None else state.suppressed[1],
        "runs held back by": "nothing" if held_back is None
        else HELD_BACK_BY.get(held_back, held_back),
        "cooldown until": state.cooldown_until or "none",
        "runs in the last hour": view.runs_last_hour,
        "runs in the last day": view.runs_last_day,
        "pending": len(state.pending),
        "open orders": len(state.orders),
        "mode": config.mode.value, "cap": config.cap, "drop policy": config.drop_policy.value,
        "max runs per hour": budgets.max_runs_per_hour or "unlimited",
        "max runs per day": budgets.max_runs_per_day or "unlimited",
        "no-trade cooldown (ms)": budgets.no_trade_cooldown_ms,
        "schedules": len(state.schedules),
    }
    for name in state.counters.__dataclass_fields__:
        facts[COUNTER_NAMES.get(name, name.replace("_", " "))] = getattr(state.counters, name)
    return facts


def diff_json(before: AgentState, after: AgentState, start: dict[str, int],
              end: dict[str, int]) -> dict[str, Any]:
    """What changed in an agent from one replayed state to another: each fact that differs
    (trading, lane, budgets, config, counters), the pending requests added and removed, the
    orders opened, closed and filled, and the position per symbol."""
    was, now = _facts(before), _facts(after)
    changes: list[dict[str, Any]] = [{"what": key, "before": was[key], "after": now[key]}
                                 for key in now if was[key] != now[key]]
    pending_before = [p.request.request_id for p in before.pending]
    pending_after = [p.request.request_id for p in after.pending]
    orders: list[dict[str, Any]] = []
    for order_id in sorted(before.orders.keys() | after.orders.keys()):
        old, new = before.orders.get(order_id), after.orders.get(order_id)
        if old is None and new is not None:
            orders.append({"orderId": order_id, "change": "opened", "symbol": new.intent.symbol,
                           "side": new.intent.side, "qty": new.intent.qty,
                           "filled": new.filled_qty, "flatten": not new.run_id})
        elif new is None and old is not None:
            orders.append({"orderId": order_id, "change": "closed", "symbol": old.intent.symbol,
                           "side": old.intent.side, "qty": old.intent.qty,
                           "filled": old.filled_qty})
        elif old is not None and new is not None and old != new:
            orders.append({"orderId": order_id, "change": "changed",
                           "symbol": new.intent.symbol, "side": new.intent.side,
                           "qty": new.intent.qty, "filledBefore": old.filled_qty,
                           "filled": new.filled_qty,
                           "cancelRequested": new.cancel_requested})
    positions: list[dict[str, Any]] = [{"symbol": s, "before": before.positions.get(s, 0.0),
                  "after": after.positions.get(s, 0.0)}
                 for s in sorted(before.positions.keys() | after.positions.keys())
                 if before.positions.get(s, 0.0) != after.positions.get(s, 0.0)]
    return {
        "agentId": after.agent_id, "from": start, "to": end,
        "changes": changes,
        "pending": {"added": [r for r in pending_after if r not in pending_before],
                    "removed": [r for r in pending_before if r not in pending_after]},
        "orders": orders,
        "positions": positions,
    }
