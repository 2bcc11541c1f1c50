"""Taking an agent over without reading its whole stream on the event loop.

A member adopting an agent starts from the agent's replica (`gateway.cluster.replicas`: the
fold of the log from the newest snapshot on, kept up as the log commits, so a fold of a
prefix of the stream, which it stops following while the agent is adopted), copied in a
thread, and folds only the tail of the stream the replica has not seen, a chunk at a time,
giving the loop back between chunks. The config the config file
last gave the agent is looked for in the tail, and further back (a chunk at a time too)
only when the file's config differs from the agent's.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from gateway.base.quarantine import LogReader
from lanes import AgentConfig, AgentState
from lanes.events import ConfigChanged
from lanes.evolve import fold
from lanes.gate import GateState, decode_gate_event, evolve_gate
from store.port import EventStore, RecordedEvent

T = TypeVar("T")

CHUNK: Final = 200
"""Events read and folded at a time: a few milliseconds of the loop at most."""


@dataclass(slots=True)
class Adopted:
    """An agent's state caught up with its stream, and whether the config file's entry
    for it changed since the file last gave it one (then it is applied again)."""

    state: AgentState
    file_changed: bool


def copy_state(state: T) -> T:
    """An independent copy of a state (it may be cut between an input and its decisions, so
    not through a snapshot image, which needs a state at rest): through pickle, about five
    times faster than `copy.deepcopy` on a long stream's state (it holds the GIL less)."""
    copied: T = pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    return copied


async def catch_up(store: EventStore, reader: LogReader, agent_id: str,
                   base: AgentState | None, file_config: AgentConfig | None) -> Adopted:
    """``base`` (a fold of the first ``base.version`` events of the agent's stream, or
    None: from the start) copied and folded through the rest of the stream, a chunk at a
    time; and whether ``file_config`` (the config file's entry, if any) differs from the
    config the file last gave the agent (one the agent has already counts as given). The
    copy is made in a thread (a big state takes some 10 ms; the loop gets its turns
    meanwhile), so ``base`` must not change until the copy is made."""
    state = await asyncio.to_thread(copy_state, base) if base is not None \
        else AgentState(agent_id=agent_id)
    found: AgentConfig | None = None
    async for records in _tail(store, agent_id, lambda: state.version):
        fold(state, (reader.decode(r) for r in records))
        found = _file_config(reader, records) or found
    if file_config is None:
        return Adopted(state, False)
    if found is None:
        if file_config == state.config:  # nothing to apply (no need to look further back)
            return Adopted(state, False)
        found = await _file_config_before(store, reader, agent_id, state.version)
    return Adopted(state, file_config != found)


async def catch_up_gate(store: EventStore, stream: str, base: GateState | None) -> GateState:
    """A provider gate's ``base`` (its replica, or None: from the start) copied (in a
    thread) and folded through the rest of its stream, a chunk at a time."""
    state = await asyncio.to_thread(copy_state, base) if base is not None \
        else GateState(provider=stream)
    async for records in _tail(store, stream, lambda: state.version):
        for record in records:
            evolve_gate(state, decode_gate_event(record.type, record.data))
    return state


async def _tail(store: EventStore, stream: str, version: Callable[[], int]
                ) -> AsyncIterator[list[RecordedEvent]]:
    """The events of ``stream`` after the version its fold is at (``version()``, asked
    before each read), a chunk at a time, the loop given a turn between chunks."""
    while True:
        at = version()
        records = await store.read_stream(stream, at, CHUNK)
        if not records:
            return
        if records[0].version != at + 1:  # (a store's contract: never)
            raise RuntimeError(f"{stream}: the stream does not continue at {at + 1}")
        yield records
        if len(records) < CHUNK:
            return
        await asyncio.sleep(0)


def _file_config(reader: LogReader, records: list[RecordedEvent]) -> AgentConfig | None:
    for record in reversed(records):
        if record.type == ConfigChanged.__name__:
            event = reader.decode(record)
            if isinstance(event, ConfigChanged) and event.principal == "config":
                return event.config
    return None


async def _file_config_before(store: EventStore, reader: LogReader, agent_id: str,
                              version: int) -> AgentConfig | None:
    """The config file's last config in the stream up to ``version``, read backwards a
    chunk at a time."""
    while version > 0:
        start = max(0, version - CHUNK)
        records = await store.read_stream(agent_id, start, version - start)
        found = _file_config(reader, records)
        if found is not None:
            return found
        version = start
        await asyncio.sleep(0)
    return None
