"""What-if from a moment of time travel (``POST /api/agents/{id}/whatif``): the agent as it
was at a log position (replayed from the log), then its recorded inputs after it re-run
under another config (`lanes.whatif.whatif_from`, the model of ``gateway whatif``), and
recorded against what-if, measure by measure, as the CLI prints them.

The simulation is CPU work: it runs in a process of its own, one at a time (another ask
meanwhile is answered busy), over at most `MAX_WHATIF_EVENTS` events of the stream.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from gateway.base.quarantine import LogReader
from gateway.errors import Busy
from gateway.reads.replays import Replayed
from gateway.tools.what_if import WHATIF_ROWS
from lanes import AgentConfig
from lanes.events import INPUT_TYPES
from lanes.evolve import evolve
from lanes.requests import MAX_INT, WireModel
from lanes.state import AgentState
from lanes.whatif import AgentWhatIf, whatif_from
from store.port import LogReads, RecordedEvent

MAX_WHATIF_EVENTS = 200_000
"""Events of the agent's stream after the position that one what-if re-runs at most."""
MAX_WORKER_FOLD = 200_000
"""Events before the position the worker folds itself; past it, it is given the agent as
time travel's cache has it (a longer wait for its pickling, none for the fold)."""
PAGE = 1_000
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
    """Runs what-ifs one at a time in a worker process (a fresh interpreter at a low
    priority, started at the first ask and kept: it takes seconds to start): the decoding and
    deciding of up to `MAX_WHATIF_EVENTS` events, and the garbage they make, never hold the
    gateway's event loop."""

    _pool: ProcessPoolExecutor | None = None
    """The worker, shared by every app of the process (ended with the process)."""
    _running = False

    @classmethod
    def _worker(cls) -> ProcessPoolExecutor:
        if cls._pool is None:
            cls._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"),  # (no fork of threads)
                initializer=os.nice, initargs=(19,))  # the gateway's own work comes first
        return cls._pool

    async def run(self, store: LogReads, url: str | None, reader: LogReader, agent_id: str,
                  position: int, before: int, top: int, config: AgentConfig, now: int,
                  replayed: Callable[[], Awaitable[Replayed[AgentState]]]) -> dict[str, Any]:
        """What-if from ``agent_id`` as it was at log ``position`` (``before`` events of its
        stream are at or before it; it is at version ``top`` now) under ``config``, until
        ``now`` (the log was recorded up to then). Where another process can read the log
        (``url``) and the stream before the position is not long, the worker replays the
        agent to the position and reads what follows itself; else it is given ``replayed()``
        (the time-travel cache's) and the records."""
        cls = type(self)
        if cls._running:
            raise Busy(1_000)
        cls._running = True
        try:
            moment = None if url is not None and before <= MAX_WORKER_FOLD \
                else await replayed()
            records = None if moment is None else await _after(store, agent_id,
                                                               moment.state.version, top)
            asked = _Asked(url, agent_id, position, top, config, now, dict(reader.replacements))
            try:
                found: _Found = await asyncio.get_running_loop().run_in_executor(
                    cls._worker(), whatif_in_worker, asked, moment, records)
            except BrokenProcessPool:  # (the worker died: a new one next time)
                cls._pool = None
                raise
        finally:
            cls._running = False
        return whatif_json(found.report, position, found.event_position, found.at,
                           found.until, found.events)


@dataclass(frozen=True, slots=True)
class _Asked:
    """What the worker is asked."""

    url: str | None
    agent_id: str
    position: int
    top: int
    config: AgentConfig
    now: int
    replacements: dict[int, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class _Found:
    """What the worker answers."""

    report: AgentWhatIf
    until: int
    events: int
    event_position: int
    at: int


async def _after(store: LogReads, agent_id: str, after: int, top: int) -> list[RecordedEvent]:
    """The agent's records after version ``after`` up to version ``top``."""
    records: list[RecordedEvent] = []
    while after < top:
        page = await store.read_stream(agent_id, after_version=after,
                                       limit=min(PAGE, top - after))
        if not page:
            break
        records += page
        after = page[-1].version
    return records


def whatif_in_worker(asked: _Asked, moment: Replayed[AgentState] | None,
                     records: list[RecordedEvent] | None) -> _Found:
    """(In the worker process.) The what-if: from ``moment`` and the ``records`` after it,
    or, when they are not given, replayed and read from the log at ``asked.url``."""
    reader = LogReader(asked.replacements)
    if moment is None or records is None:
        moment, records = asyncio.run(_replay(asked, reader))
    if len(records) > MAX_WHATIF_EVENTS:
        raise ValueError(f"{len(records)} events follow the moment")  # (checked before)
    state = moment.state
    at = state.now
    report, until = _simulate(reader, state, records, asked.config, asked.now)
    return _Found(report, until, len(records), moment.event_position, at)


async def _replay(asked: _Asked, reader: LogReader
                  ) -> tuple[Replayed[AgentState], list[RecordedEvent]]:
    """The agent at the position, folded from the log, and its records after it."""
    from store import open_store

    store = await open_store(asked.url or "")
    try:
        records = await _after(store, asked.agent_id, 0, asked.top)
    finally:
        await store.close()
    state = AgentState(agent_id=asked.agent_id)
    folded, event_position = 0, 0
    for record in records:
        if record.position > asked.position:
            break
        evolve(state, reader.decode(record))
        folded, event_position = folded + 1, record.position
    return Replayed(state, event_position), records[folded:]


def _simulate(reader: LogReader, state: AgentState, records: list[RecordedEvent],
              config: AgentConfig, now: int) -> tuple[AgentWhatIf, int]:
    """The report, and where the simulation ends. The decisions of the input the moment is
    in are taken in first: what-if starts at the next input."""
    entries = reader.entries(records)
    until = max([now, *(e.event.at for e in entries
                        if isinstance(e.event, _INPUTS))])
    first = 0
    while first < len(entries) and not isinstance(entries[first].event, _INPUTS):
        evolve(state, entries[first].event)
        first += 1
    return whatif_from(state, entries[first:], config, now), until


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
