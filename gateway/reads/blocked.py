"""Why an agent is not running, or what it is busy with: the reasons an operator reads at a
glance on the overview and the agent page (``blocked`` and ``attention`` of an agent's JSON).

Each reason is a dict with a ``kind`` and the facts of that kind, times as ISO strings:

- ``halted``: ``by`` (principal), ``at``, ``action`` — no run starts until a resume;
- ``held``: ``reason`` (the provider's refusal), ``at`` — runs held until a resume;
- ``reducing``: ``by``, ``at``, ``action`` — paused: reduce-only orders;
- ``suppressed``: ``budget`` (``runsPerHour`` or ``runsPerDay``), ``reason``, ``until``,
  ``detail`` — the budget's window reopens by itself;
- ``cooldown``: ``until``, ``suppressing`` (whether a pending request waits for it);
- ``gate``: ``provider``, ``limit`` (see `lanes.gate.GateWait`), ``detail``, ``nextSlotAt``,
  ``since``, ``forMs``, ``first``, ``waiting``;
- ``failed``: ``runId``, ``at``, ``error`` — the latest run failed or timed out (until a
  run completes or a resume; not while runs are held, which says why);
- ``no_worker``: ``detail`` — a worker agent (``reasoner.kind = "worker"``) with no worker
  connected on ``/ws/worker``: its runs fail at once until one connects;
- ``running``: ``runId``, ``since``, ``forMs``, ``deadline``.

``attention`` is the most severe level among them: ``critical`` (halted), ``warning``
(held, reducing, suppressed, a failed run, no worker, a gate wait of `GATE_SLOW_MS` or
more), ``info`` (cooldown, a short gate wait) or ``none``.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.market.events import from_ms, iso
from lanes.events import TradingState
from lanes.gate import GateWait
from lanes.state import AgentState

GATE_SLOW_MS: Final = 10_000
"""A gate wait this long needs a look (a wait is normally a few hundred ms)."""
LEVELS: Final = ("none", "info", "warning", "critical")
"""Attention levels, least severe first."""
BUDGETS: Final = {"hourly": "runsPerHour", "daily": "runsPerDay"}
"""A budget suppression's reason -> the budget's name in the config."""


def _at(ms: int | None) -> str | None:
    return None if ms is None else iso(from_ms(ms))


def blocked_view(state: AgentState, now: int, provider: str | None = None,
                 wait: GateWait | None = None, *, no_worker: bool = False
                 ) -> tuple[list[dict[str, Any]], str]:
    """The reasons of ``state`` at ``now`` (most severe first) and its attention level;
    ``wait`` is why its calls wait at its provider's gate (``provider``), if they do;
    ``no_worker``: it is a worker agent and no worker is connected for it."""
    reasons: list[tuple[str, dict[str, Any]]] = []
    change = state.trading_change
    who = {} if change is None else {"by": change.by, "at": _at(change.at),
                                     "action": change.action}
    if state.trading is TradingState.HALTED:
        reasons.append(("critical", {"kind": "halted", "by": None, "at": None, "action": None,
                                     **who}))
    if state.held is not None:
        at = change.at if change is not None and change.action == "hold" else None
        reasons.append(("warning", {"kind": "held", "reason": state.held, "at": _at(at)}))
    elif state.trading is TradingState.REDUCING:
        reasons.append(("warning", {"kind": "reducing", "by": None, "at": None,
                                    "action": None, **who}))
    suppressed = state.suppressed
    if suppressed is not None and suppressed[0] in BUDGETS:
        budget = BUDGETS[suppressed[0]]
        limit = (state.config.budgets.max_runs_per_hour if budget == "runsPerHour"
                 else state.config.budgets.max_runs_per_day)
        reasons.append(("warning", {"kind": "suppressed", "budget": budget,
                                    "reason": f"{budget} budget", "limit": limit,
                                    "until": _at(suppressed[1]), "pending": len(state.pending)}))
    if state.failure is not None and state.held is None:  # (a hold says why already)
        run_id, failed_at, error = state.failure
        reasons.append(("warning", {"kind": "failed", "runId": run_id, "at": _at(failed_at),
                                    "error": error}))
    if no_worker:
        reasons.append(("warning", {"kind": "no_worker", "detail": "no worker is connected "
                                    "on /ws/worker for this agent: its runs fail at once until "
                                    "one connects"}))
    if now < state.cooldown_until:
        suppressing = suppressed is not None and suppressed[0] == "cooldown"
        reasons.append(("info", {"kind": "cooldown", "until": _at(state.cooldown_until),
                                 "suppressing": suppressing}))
    if wait is not None:
        waited = max(0, now - wait.since)
        reasons.append(("warning" if waited >= GATE_SLOW_MS else "info", {
            "kind": "gate", "provider": provider, "limit": wait.limit, "detail": wait.detail,
            "nextSlotAt": _at(wait.next_slot_at), "since": _at(wait.since), "forMs": waited,
            "first": wait.first, "waiting": wait.waiting}))
    run = state.active
    if run is not None:
        reasons.append(("none", {"kind": "running", "runId": run.run_id,
                                 "since": _at(run.started_at),
                                 "forMs": max(0, now - run.started_at),
                                 "deadline": _at(run.deadline)}))
    level = max((LEVELS.index(level) for level, _ in reasons), default=0)
    return [reason for _, reason in reasons], LEVELS[level]
