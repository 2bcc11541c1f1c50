"""The desk's token and spend budgets (``[desk.budgets]``): the usage of every run of the
agents this process decides for, over sliding windows, as `lanes.spending` counts an agent's.

Each agent keeps its completed runs' usage of the last day in its state while a desk budget
is configured (``Budgets.desk_counted``), so the desk's is summed from the agents' states at
the start and kept up to date from each `RunCompleted` after. A run that takes the desk's use
across an ``alert_at`` fraction is logged (a warning, once per crossing) and counted on
``/metrics``; one that uses a budget up holds every agent's runs back until enough usage has
left its window: the input `DeskBudgetSpent` is recorded in each agent's stream, so the
suppression (``reason`` ``desk``, the budget named) replays exactly. Beside other processes
each one counts the agents it decides for.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from gateway.base.tasks import spawn
from gateway.errors import GatewayError
from lanes.config import DAY_MS, Budgets
from lanes.events import DeskBudgetSpent, Usage
from lanes.spending import BUDGETS, Entry, blocks, crossed, entry, used

if TYPE_CHECKING:
    from gateway.runtime.engine import Engine

log = logging.getLogger("gateway.desk")


class DeskBudget:
    """The desk's budgets over the engine's agents (``budgets`` None: none)."""

    def __init__(self, engine: Engine, budgets: Budgets | None) -> None:
        self._engine = engine
        self.budgets = budgets
        self._entries: deque[Entry] = deque()
        self.block: tuple[int, str] | None = None
        """Until when the desk holds runs back, and which budget (the latest applied)."""
        self.alerts = 0
        """Alerts said since the start (``gateway_desk_budget_alerts_total``)."""

    def start(self) -> None:
        """Sum the usage kept in the agents' states (after a start or a restart), and hold
        the agents back if a budget is used up already."""
        if self.budgets is None:
            return
        engine = self._engine
        now = engine.clock.now_ms()
        kept = sorted(item for agent_id in engine.agent_ids
                      for item in engine.state(agent_id).spend if item[0] > now - DAY_MS)
        self._entries = deque(kept)
        self._check(now)

    def completed(self, at: int, usage: Usage) -> None:
        """A run of an agent of this process completed at ``at`` with ``usage``."""
        if self.budgets is None:
            return
        this = entry(at, usage)
        self._entries.append(this)
        while self._entries and self._entries[0][0] <= at - DAY_MS:
            self._entries.popleft()
        for alert in crossed(self._entries, self.budgets, this, at):
            self.alerts += 1
            log.warning("desk budget %s at %d%% this %s (%g of %g)", alert.budget,
                        round(alert.fraction * 100), alert.window, alert.used, alert.limit)
        self._check(at)

    def _check(self, now: int) -> None:
        assert self.budgets is not None
        found = blocks(self._entries, self.budgets, now)
        if not found:
            return
        last = max(found, key=lambda b: b.until)
        block = (last.until, f"desk budget: {last.detail}")
        if self.block is not None and self.block[0] >= block[0]:
            return  # (held back until then already)
        self.block = block
        log.warning("desk budget used up: no run of any agent starts until %d (%s)", *block)
        spawn(self._hold(now, *block), "desk budget")

    async def _hold(self, now: int, until: int, detail: str) -> None:
        """Record the hold in every agent's stream (an agent that cannot take it now, being
        rebuilt or moved, is skipped: its runs are not held)."""
        engine = self._engine
        for agent_id in engine.agent_ids:
            try:
                await engine.report(agent_id, DeskBudgetSpent(at=now, until=until,
                                                              detail=detail))
            except GatewayError as error:
                log.warning("desk budget hold not recorded for %s: %s", agent_id, error)

    def status(self, now: int) -> dict[str, Any]:
        """Each budget's use now (``GET /api/desk/budget``)."""
        budgets = self.budgets
        if budgets is None:
            return {"configured": False, "budgets": [], "heldUntil": None}
        rows = []
        for budget in BUDGETS:
            limit = budget.limit(budgets)
            if limit is None:
                continue
            spent = used(self._entries, budget, now)
            rows.append({"budget": budget.field, "window": budget.window,
                         "used": round(spent, 6), "limit": limit,
                         "fraction": round(spent / limit, 6)})
        held = self.block if self.block is not None and self.block[0] > now else None
        return {"configured": True, "budgets": rows, "alertAt": list(budgets.alert_at),
                "heldUntil": None if held is None else held[0],
                "detail": None if held is None else held[1]}
