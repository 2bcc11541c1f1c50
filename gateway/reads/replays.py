"""Agents and provider gates replayed at a log position for time travel (``/api/replay``,
``/moment``, ``/diff``): each stream folded once, keeping a copy of its state every so many
events (a checkpoint), so that the state at any position is a checkpoint plus at most that
many events; later asks fold only what was appended since. A cache of a fold of the log,
never the source of truth.

The fold runs a step at a time with the event loop's other work in between: a viewer
travelling back on a long stream must not hold an emergency stop (measured before, on an
agent of 100,000 events: a pick held the loop 0.5 to 1.5 s).
"""

from __future__ import annotations

import asyncio
import pickle
import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gateway.base.quarantine import LogReader
from gateway.reads.tails import steps
from lanes.evolve import evolve
from lanes.gate import GateState, decode_gate_event, evolve_gate
from lanes.state import AgentState
from store.port import LogReads, RecordedEvent

CHECKPOINT_EVERY = 2_000
"""Events of an agent between two kept states, at first: the most a time-travel ask folds."""
MAX_CHECKPOINTS = 256
MAX_BYTES = 16 * 2**20
"""Kept states per agent, and their size in all; past either, every other one goes and the
spacing doubles, so an agent's memory stays bounded however long its stream grows. (An
agent's state grows with what it must remember, the request ids it has seen above all:
measured, 0.4 MB compressed after 100,000 events in half an hour.)"""
MAX_REPLAYED = 8
"""Streams of each kind kept (the least recently asked for goes first): at most 128 MiB of
checkpoints for agents, and as much for provider gates."""


class _Versioned(Protocol):
    version: int
    """How many events of the stream have been folded in (the stream version)."""


S = TypeVar("S", bound=_Versioned)
Step = Callable[[LogReader, S, RecordedEvent], object]
"""Fold one record into a state (``reader`` decodes an agent's events)."""


@dataclass(frozen=True, slots=True)
class Replayed(Generic[S]):
    """An agent or a provider gate as it was at a log position."""

    state: S
    """Its state: the fold of every event of its stream at or before the position (the
    caller's own copy)."""
    event_position: int
    """The log position of the last of those events (0: none)."""


@dataclass(slots=True)
class _Checkpoint:
    version: int
    position: int
    image: bytes
    """The state after the stream's events up to ``version``, pickled and compressed."""


@dataclass(slots=True)
class _Folded(Generic[S]):
    """One stream folded so far, with its checkpoints."""

    reader: LogReader
    state: S
    every: int
    most: int
    """At most this many checkpoints..."""
    budget: int
    """... and this many bytes of them."""
    position: int = 0
    size: int = 0
    """The checkpoints' bytes."""
    checkpoints: list[_Checkpoint] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    """The checkpoints' positions, for `bisect_right`."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def keep(self, image: bytes) -> None:
        """Keep ``image`` (`_packed`: the state as it is now) as a checkpoint."""
        self.checkpoints.append(_Checkpoint(self.state.version, self.position, image))
        self.positions.append(self.position)
        self.size += len(image)
        while (len(self.checkpoints) > self.most or self.size > self.budget) \
                and len(self.checkpoints) > 1:
            self.every *= 2
            self.checkpoints = [c for c in self.checkpoints if c.version % self.every == 0]
            self.positions = [c.position for c in self.checkpoints]
            self.size = sum(len(c.image) for c in self.checkpoints)


class Replays(Generic[S]):
    """Time travel's replays of one kind of stream (see the module): `agent_replays`,
    `gate_replays`."""

    def __init__(self, fresh: Callable[[str], S], step: Step[S], streams: int = MAX_REPLAYED,
                 every: int = CHECKPOINT_EVERY, checkpoints: int = MAX_CHECKPOINTS,
                 budget: int = MAX_BYTES) -> None:
        self._fresh, self._step = fresh, step
        self._folded: OrderedDict[str, _Folded[S]] = OrderedDict()
        self._streams, self._every = streams, every
        self._most, self._budget = checkpoints, budget

    async def at(self, store: LogReads, reader: LogReader, stream: str, position: int
                 ) -> Replayed[S]:
        """``stream``'s state at log ``position``, replayed from the stream (decoded by
        ``reader``, which knows the events set aside)."""
        folded = self._folded.get(stream)
        if folded is None or folded.reader is not reader:
            fresh = self._fresh(stream)
            folded = _Folded(reader, fresh, self._every, self._most, self._budget)
            folded.keep(zlib.compress(pickle.dumps(fresh, pickle.HIGHEST_PROTOCOL), 1))
            self._folded[stream] = folded
            while len(self._folded) > self._streams:
                self._folded.popitem(last=False)
        self._folded.move_to_end(stream)
        async with folded.lock:  # two folds of the same new events would fold them twice
            await self._catch_up(store, stream, folded)
            if position >= folded.position:  # the stream as it is now
                return Replayed(_copy(folded.state), folded.position)
            base = folded.checkpoints[bisect_right(folded.positions, position) - 1]
        # The events after the checkpoint up to the position (fewer than the spacing: the
        # next checkpoint, if there is one, is later than the position).
        state: S = await _unpacked(base.image)
        last = base.position
        async with aclosing(steps(store, stream, state.version)) as reading:
            async for step in reading:
                for record in step:
                    if record.position > position:
                        return Replayed(state, last)
                    self._step(reader, state, record)
                    last = record.position
        return Replayed(state, last)

    async def _catch_up(self, store: LogReads, stream: str, folded: _Folded[S]) -> None:
        """Fold what the stream gained since the last ask, keeping checkpoints."""
        state, reader = folded.state, folded.reader
        async with aclosing(steps(store, stream, state.version)) as reading:
            async for step in reading:
                for record in step:
                    self._step(reader, state, record)
                    folded.position = record.position
                    if state.version % folded.every == 0:
                        folded.keep(await _packed(state))


def agent_replays(**bounds: int) -> Replays[AgentState]:
    """Replays of agents (``bounds``: `Replays`' sizes)."""
    return Replays(lambda stream: AgentState(agent_id=stream),
                   lambda reader, state, record: evolve(state, reader.decode(record)), **bounds)


def gate_replays(**bounds: int) -> Replays[GateState]:
    """Replays of provider gates, by their streams (``bounds``: `Replays`' sizes)."""
    return Replays(lambda stream: GateState(provider=stream),
                   lambda _reader, state, record: evolve_gate(
                       state, decode_gate_event(record.type, record.data)), **bounds)


def _copy(state: S) -> S:
    copied: S = pickle.loads(pickle.dumps(state, pickle.HIGHEST_PROTOCOL))
    return copied


async def _packed(state: _Versioned) -> bytes:
    """``state`` pickled (here: it cannot change meanwhile) and compressed, in a thread
    (zlib lets the event loop go on): a long-lived agent's state is large, above all the
    request ids it has seen (1.9 MB pickled, 0.4 MB compressed)."""
    return await asyncio.to_thread(zlib.compress, pickle.dumps(state, pickle.HIGHEST_PROTOCOL), 1)


async def _unpacked(image: bytes) -> S:
    raw = await asyncio.to_thread(zlib.decompress, image)
    state: S = pickle.loads(raw)
    return state
