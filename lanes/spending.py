"""Token and spend budgets of one agent: input and output tokens and money per hour and per
day (`lanes.config.Budgets`), over sliding windows of its completed runs.

While any such budget is set, each completed run's usage is kept (`AgentState.spend`, the
last day's). A run that takes a budget's use across one of its ``alert_at`` fractions
records a `BudgetAlert`; a budget used up holds runs back (`RunsSuppressed`, the budget
named) until enough of the window's runs have left it. A run is counted when it completes
(a failed or aborted run's tokens are not known to the lane).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lanes.config import DAY_MS, HOUR_MS, Budgets
from lanes.events import BudgetAlert, Usage
from lanes.state import AgentState

if TYPE_CHECKING:
    from lanes.rules import BudgetBlock

Entry = tuple[int, int, int, float]
"""A completed run's (at, input tokens, output tokens, cost)."""


@dataclass(frozen=True, slots=True)
class Budget:
    """One token or spend budget: its config field, what it counts, its window."""

    field: str
    words: str
    window: Literal["hour", "day"]
    count: Callable[[Entry], float]

    @property
    def span(self) -> int:
        """The window's length, ms."""
        return HOUR_MS if self.window == "hour" else DAY_MS

    def limit(self, budgets: Budgets) -> float | None:
        """The budget's limit in ``budgets`` (None: not set)."""
        value: float | None = getattr(budgets, self.field)
        return value


BUDGETS = (
    Budget("max_input_tokens_per_hour", "input tokens", "hour", lambda e: e[1]),
    Budget("max_input_tokens_per_day", "input tokens", "day", lambda e: e[1]),
    Budget("max_output_tokens_per_hour", "output tokens", "hour", lambda e: e[2]),
    Budget("max_output_tokens_per_day", "output tokens", "day", lambda e: e[2]),
    Budget("max_spend_per_hour", "spend", "hour", lambda e: e[3]),
    Budget("max_spend_per_day", "spend", "day", lambda e: e[3]),
)


def used(entries: Iterable[Entry], budget: Budget, now: int) -> float:
    """What ``budget`` counts of the runs in its window at ``now``."""
    start = now - budget.span
    return sum(budget.count(entry) for entry in entries if entry[0] > start)


def record(state: AgentState, usage: Usage) -> None:
    """Keep a completed run's usage (while a token or spend budget is set)."""
    budgets = state.config.budgets
    if not (budgets.spending or budgets.desk_counted):
        return
    spend = state.spend
    spend.append((state.now, usage.input_tokens, usage.output_tokens, usage.cost or 0.0))
    while spend and spend[0][0] <= state.now - DAY_MS:
        spend.popleft()


def alerts(state: AgentState, usage: Usage, emit: Callable[[BudgetAlert], None]) -> None:
    """The alerts a just completed run's ``usage`` (already kept) sets off."""
    budgets = state.config.budgets
    if budgets.spending:
        for alert in crossed(state.spend, budgets, entry(state.now, usage), state.now):
            emit(alert)


def entry(at: int, usage: Usage) -> Entry:
    """A completed run's entry."""
    return (at, usage.input_tokens, usage.output_tokens, usage.cost or 0.0)


def crossed(entries: Iterable[Entry], budgets: Budgets, this: Entry, now: int
            ) -> list[BudgetAlert]:
    """The alerts the entry ``this`` (already among ``entries``) sets off: one per budget
    whose use it took across one of the ``alert_at`` fractions or 1 (the highest)."""
    found = []
    kept = list(entries)
    for budget in BUDGETS:
        limit = budget.limit(budgets)
        if limit is None:
            continue
        after = used(kept, budget, now)
        before = after - budget.count(this)
        fractions = [f for f in sorted({*budgets.alert_at, 1.0}) if before < f * limit <= after]
        if fractions:
            found.append(BudgetAlert(budget=budget.field, window=budget.window,
                                     fraction=fractions[-1], used=round(after, 6),
                                     limit=limit))
    return found


def spend_blocks(state: AgentState) -> list[BudgetBlock]:
    """The token and spend budgets used up at ``state.now``, each with when it frees."""
    return blocks(state.spend, state.config.budgets, state.now)


def blocks(entries: Iterable[Entry], budgets: Budgets, now: int) -> list[BudgetBlock]:
    """The token and spend budgets of ``budgets`` that ``entries`` (oldest first) use up at
    ``now``, each with when enough of them has left its window."""
    from lanes.rules import BudgetBlock  # (rules builds on this module)

    kept, found = list(entries), []
    for budget in BUDGETS:
        limit = budget.limit(budgets)
        if limit is None:
            continue
        total = used(kept, budget, now)
        if total < limit:
            continue
        start, until = now - budget.span, now + budget.span
        for item in kept:  # oldest first: free until below the limit
            if item[0] <= start:
                continue
            total -= budget.count(item)
            if total < limit:
                until = item[0] + budget.span
                break
        kind: Literal["tokens", "spend"] = "spend" if budget.words == "spend" else "tokens"
        found.append(BudgetBlock(kind, until, f"{budget.words} {_amount(limit)}/"
                                 f"{_amount(limit)} this {budget.window} ({budget.field})"))
    return found


def _amount(value: float) -> str:
    return f"{value:,.2f}" if value != int(value) else f"{int(value):,}"
