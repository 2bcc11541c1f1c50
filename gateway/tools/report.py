"""Readable tables of agent state for the terminal."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.runtime.engine import Engine
from lanes import AgentStatus


def status_table(statuses: Iterable[AgentStatus]) -> list[str]:
    """One row per agent: trading state, lane, queue, active run and counters."""
    rows = [
        f"{'agent':<14} {'trading':<9} {'lane':<8} {'mode':<14} {'pending':>7} {'oldest':>8} "
        f"{'active run':<18} {'runs':>4} {'aborts':>6} {'drops':>5} {'dedupes':>7} "
        f"{'suppr':>5}"
    ]
    for s in statuses:
        run = s.active_run
        active = "-" if run is None else f"{run.run_id} {run.duration_ms / 1000:.1f}s"
        oldest = "-" if s.oldest_pending_age_ms is None else f"{s.oldest_pending_age_ms}ms"
        c = s.counters
        rows.append(
            f"{s.agent_id:<14} {s.trading.value:<9} {s.lane.value:<8} {s.mode.value:<14} "
            f"{s.pending:>7} {oldest:>8} {active:<18} {c.runs:>4} {c.aborts:>6} {c.drops:>5} "
            f"{c.dedupes:>7} {c.suppressions:>5}"
        )
    return rows


def print_status(engine: Engine, out: Callable[[str], None] = print) -> None:
    """Print the status table of every agent of an engine."""
    for line in status_table(engine.status(a) for a in engine.agent_ids):
        out(line)
