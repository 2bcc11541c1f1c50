"""A scrape's per-agent series, bounded (Prometheus keeps every series it has seen): the
agents that need attention first, then the deepest queues, up to a cap; every other agent's
values summed under ``agent="_other"``. Rendered a step at a time, so that a big desk's
scrape never holds the event loop for long (an emergency stop waits at most one step)."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.base.metrics import family, label
from gateway.runtime.engine import Engine
from lanes import AgentStatus, status
from lanes.vocabulary import TradingState

OTHER = "_other"
"""The label value of the agents past the cap: each of their values summed."""
STATUSES_PER_STEP = 20
"""Agents' statuses a scrape computes before it lets other work run (100 a step held the
loop for 3 to 5 ms; with 40, and 1,000 samples a step, a turn of a scrape at 10,000 agents
with the schedules' pass held it for 6 to 6.5 ms, 3.7 to 5 ms with these)."""
SAMPLES_PER_STEP = 500
"""Samples a scrape renders (or rows it sums) before it lets other work run."""

Value = Callable[[AgentStatus], float]


@dataclass(frozen=True, slots=True)
class Family:
    """A per-agent metric family: one sample per agent."""

    name: str
    kind: str
    help: str
    value: Value


FAMILIES = (
    Family("gateway_pending_requests", "gauge", "Requests waiting in the reasoning lane.",
           lambda v: v.pending),
    Family("gateway_oldest_pending_seconds", "gauge", "Age of the oldest pending request.",
           lambda v: (v.oldest_pending_age_ms or 0) / 1000),
    Family("gateway_active_run_seconds", "gauge", "Duration of the active run (0: idle).",
           lambda v: v.active_run.duration_ms / 1000 if v.active_run else 0),
    Family("gateway_halted", "gauge", "1 while the agent is HALTED.",
           lambda v: int(v.trading is TradingState.HALTED)),
    Family("gateway_runs_total", "counter", "Runs started.", lambda v: v.counters.runs),
    Family("gateway_aborts_total", "counter", "Runs aborted.", lambda v: v.counters.aborts),
    Family("gateway_drops_total", "counter", "Requests dropped.", lambda v: v.counters.drops),
    Family("gateway_dedupes_total", "counter", "Requests deduped.",
           lambda v: v.counters.dedupes),
    Family("gateway_budget_suppressions_total", "counter",
           "Times runs were held by a runs budget (per hour, per day).",
           lambda v: v.counters.suppressions),
    Family("gateway_cooldowns_total", "counter",
           "Times runs waited for the cooldown after a no-trade run.",
           lambda v: v.counters.cooldowns),
    Family("gateway_suppressed", "gauge", "1 while a budget suppresses the agent's runs.",
           lambda v: int(v.suppressed_until is not None)),
    Family("gateway_held", "gauge", "1 while the agent's runs are held until a resume "
           "(the provider refused for spend).", lambda v: int(v.held is not None)),
    Family("gateway_approvals_pending", "gauge", "Orders waiting for a human's approval.",
           lambda v: v.pending_approvals),
)
"""Every per-agent family, in the order of a row's values."""
HALTED, SUPPRESSED, HELD = (
    [f.name for f in FAMILIES].index(n)
    for n in ("gateway_halted", "gateway_suppressed", "gateway_held"))
PENDING = 0

Row = tuple[Any, ...]
"""An agent's values, in the order of `FAMILIES` (numbers only: the collector leaves such
tuples alone)."""


@dataclass(slots=True)
class AgentSeries:
    """The per-agent part of a scrape: the agents shown and their rows, the others' sums."""

    shown: list[tuple[str, Row]]
    """Agents with series of their own (in the engine's order) and their values."""
    other: Row | None
    """Each value summed over the other agents (None: there are none)."""
    counts: dict[str, int]
    """Agents by what holds them (``halted``, ``reducing``, ``suppressed``, ``held``), over
    every agent."""


async def agent_series(engine: Engine, agent_ids: Sequence[str], now: int,
                       cap: int) -> AgentSeries:
    """The values of ``agent_ids`` at ``now``: the first ``cap`` by attention (HALTED, held,
    suppressed by a budget, with a storage fault), then by queue depth (deepest first),
    then in the engine's order; the rest summed. A turn of the loop every
    `STATUSES_PER_STEP` agents."""
    rows: list[Row] = []
    top = Top(cap)
    counts = dict.fromkeys(("halted", "reducing", "suppressed", "held"), 0)
    for start in range(0, len(agent_ids), STATUSES_PER_STEP):
        if start:
            await asyncio.sleep(0)
        for agent_id in agent_ids[start:start + STATUSES_PER_STEP]:
            view = status(engine.state(agent_id), now)
            row: Row = tuple(f.value(view) for f in FAMILIES)
            present = engine.present(agent_id)
            top.offer(bool(row[HALTED] or row[HELD] or row[SUPPRESSED])
                      or (present is not None and present.fault is not None),
                      row[PENDING], len(rows))
            rows.append(row)
            counts["halted"] += row[HALTED]
            counts["reducing"] += view.trading is TradingState.REDUCING
            counts["suppressed"] += row[SUPPRESSED]
            counts["held"] += row[HELD]
    await asyncio.sleep(0)
    chosen = top.chosen()
    shown = [(agent_ids[i], rows[i]) for i in chosen]
    if len(chosen) == len(rows):
        return AgentSeries(shown, None, counts)
    kept = set(chosen)
    sums: list[float] = [0] * len(FAMILIES)
    for start in range(0, len(rows), SAMPLES_PER_STEP):
        await asyncio.sleep(0)
        rest = [row for i, row in enumerate(rows[start:start + SAMPLES_PER_STEP], start)
                if i not in kept]
        for j, column in enumerate(zip(*rest, strict=True)):
            sums[j] += sum(column)
    return AgentSeries(shown, tuple(sums), counts)


class Top:
    """The ``cap`` items to show, chosen an item at a time (`offer`): those with attention
    first, then the deepest, ties to the earlier. A scrape chooses as it goes, so that
    choosing among 10,000 agents is never one step of the loop (a sort of them all at the
    end took 2 ms there)."""

    __slots__ = ("_cap", "_heap")

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._heap: list[tuple[bool, int, int]] = []
        """The ``cap`` greatest (attention, depth, -index) so far, the least first."""

    def offer(self, attention: bool, depth: int, index: int) -> None:
        """The item ``index`` (given in order, from 0)."""
        key = (attention, depth, -index)
        heap = self._heap
        if len(heap) < self._cap:
            heapq.heappush(heap, key)
        elif heap and key > heap[0]:
            heapq.heapreplace(heap, key)

    def chosen(self) -> list[int]:
        """The indexes of the items chosen among those offered, in order."""
        return sorted(-index for _, _, index in self._heap)


async def series_pieces(series: AgentSeries) -> AsyncIterator[str]:
    """The text of each per-agent family, `SAMPLES_PER_STEP` samples a piece, a turn of the
    loop between two pieces; each piece ends with a newline."""
    for j, fam in enumerate(FAMILIES):
        async for piece in family_pieces(series, j, fam):
            yield piece


async def family_pieces(series: AgentSeries, j: int, fam: Family) -> AsyncIterator[str]:
    """The text of per-agent family ``fam`` (the ``j``-th value of a row)."""
    lines = family(fam.name, fam.kind, fam.help, ())
    shown = series.shown
    for start in range(0, len(shown), SAMPLES_PER_STEP):
        await asyncio.sleep(0)
        lines += [f'{fam.name}{{agent="{label(agent_id)}"}} {row[j]}'
                  for agent_id, row in shown[start:start + SAMPLES_PER_STEP]]
        yield "\n".join(lines) + "\n"
        lines = []
    if series.other is not None:
        lines.append(f'{fam.name}{{agent="{OTHER}"}} {series.other[j]}')
    if lines:
        yield "\n".join(lines) + "\n"
