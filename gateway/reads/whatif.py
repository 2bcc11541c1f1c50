"""What-if from a moment of time travel (``POST /api/agents/{id}/whatif``): the agent as it
was at a log position (replayed from the log), then its recorded inputs after it re-run
under another config (`lanes.whatif.whatif_from`, the model of ``gateway whatif``), and
recorded against what-if, measure by measure, as the CLI prints them.

The simulation is CPU work: it runs in a worker thread, one at a time per process (another
ask meanwhile is answered busy), over at most `MAX_WHATIF_EVENTS` events of the stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from gateway.base.quarantine import LogReader
from gateway.errors import BadFrame, Busy
from gateway.reads.replays import Replayed
from gateway.tools.what_if import WHATIF_ROWS
from lanes import AgentConfig
from lanes.events import INPUT_TYPES
from lanes.evolve import evolve
from lanes.replay import Entry
from lanes.requests import MAX_INT, WireModel
from lanes.state import AgentState
from lanes.whatif import AgentWhatIf, whatif_from
from store.port import LogReads

MAX_WHATIF_EVENTS = 200_000
"""Events of the agent's stream after the position that one what-if re-runs at most."""
PAGE = 5_000
_INPUTS = tuple(INPUT_TYPES)


class WhatIfBody(WireModel):
    """Body of ``POST /api/agents/{id}/whatif``: from which log position, under which config
    (the agent's lane policy: mode, cap, drop policy, dedupe, budgets, timeouts)."""

    position: int = Field(ge=0, le=MAX_INT)
    config: AgentConfig


class SettingChange(WireModel):
    """A setting the other config changes (nested ones dotted: ``budgets.maxRunsPerHour``)."""

    setting: str
    recorded: Any = None
    whatif: Any = None


class MeasureRow(WireModel):
    """One measure, recorded against what-if (null: nothing to measure)."""

    measure: str
    recorded: int | None = None
    whatif: int | None = None
    change: int | None = None


class WhatIfJson(WireModel):
    """The answer: what happened after the moment, and what would have under ``config``."""

    agent_id: str
    position: int
    event_position: int
    """The log position of the agent's last event folded into the moment."""
    at: int
    """The agent's time at the moment (ms since the epoch)."""
    until: int
    """Where the simulation ends: the time of the ask (or the last input, if later)."""
    events: int
    """Recorded events of the agent after the moment."""
    recorded_config: AgentConfig
    config: AgentConfig
    changes: list[SettingChange]
    rows: list[MeasureRow]


class WhatIfs:
    """Runs what-ifs one at a time (the CPU is shared with everything the gateway does)."""

    def __init__(self) -> None:
        self._running = False

    async def run(self, store: LogReads, reader: LogReader, replayed: Replayed[AgentState],
                  position: int, config: AgentConfig, now: int) -> dict[str, Any]:
        """What-if from ``replayed`` (the agent at log ``position``) under ``config``, until
        ``now`` (what the log holds was recorded up to then)."""
        if self._running:
            raise Busy(1_000)
        self._running = True
        try:
            state = replayed.state
            entries = await _after(store, reader, state)
            start_at = state.now
            report = await asyncio.to_thread(_simulate, state, entries, config, now)
        finally:
            self._running = False
        until = max([now, *(e.event.at for e in entries
                            if isinstance(e.event, _INPUTS))])
        return whatif_json(report, position, replayed.event_position, start_at, until,
                           len(entries))


async def _after(store: LogReads, reader: LogReader, state: AgentState) -> list[Entry]:
    """The agent's entries after ``state`` (its stream version), at most
    `MAX_WHATIF_EVENTS`."""
    records = []
    after = state.version
    while True:
        page = await store.read_stream(state.agent_id, after_version=after, limit=PAGE)
        records += page
        if len(records) > MAX_WHATIF_EVENTS:
            raise BadFrame("invalid", f"more than {MAX_WHATIF_EVENTS:,} events of "
                           f"{state.agent_id} follow this position: pick a later one (or run "
                           "gateway whatif on the log)", field="position")
        if len(page) < PAGE:
            return reader.entries(records)
        after = page[-1].version


def _simulate(state: AgentState, entries: list[Entry], config: AgentConfig, now: int
              ) -> AgentWhatIf:
    """(In a worker thread.) The decisions of the input the moment is in are taken in
    first: what-if starts at the next input."""
    first = 0
    while first < len(entries) and not isinstance(entries[first].event, _INPUTS):
        evolve(state, entries[first].event)
        first += 1
    return whatif_from(state, entries[first:], config, now)


def whatif_json(report: AgentWhatIf, position: int, event_position: int, at: int, until: int,
                events: int) -> dict[str, Any]:
    """The answer for one agent's what-if (checked against `WhatIfJson`)."""
    rows = []
    for name, measure in WHATIF_ROWS:
        before, after = measure(report.recorded), measure(report.whatif)
        change = None if before is None or after is None else after - before
        rows.append({"measure": name, "recorded": before, "whatif": after, "change": change})
    return WhatIfJson.model_validate({
        "agentId": report.agent_id, "position": position, "eventPosition": event_position,
        "at": at, "until": until, "events": events,
        "recordedConfig": report.recorded_config or AgentConfig(),
        "config": report.config or AgentConfig(),
        "changes": [{"setting": k, "recorded": b, "whatif": a}
                    for k, b, a in report.config_changes()],
        "rows": rows}).model_dump(mode="json")
