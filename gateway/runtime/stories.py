"""Where time travel's story finds things in an agent's stream (``/story``,
``/story/find``): where each group (an input and the decisions it caused) starts, and where
each stop, drop and suppression is, kept up to date by reading only what was appended
since. A story then reads and words only the groups it shows. A cache of the log, never
the source of truth; built a step at a time with the event loop's other work in between, as
`gateway.runtime.replays` folds.
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from contextlib import aclosing
from dataclasses import dataclass, field
from itertools import pairwise

from gateway.runtime.replays import MAX_STREAMS, steps
from gateway.tools.debugger import JUMP_KINDS, JUMP_TYPES, Group, kinds_of
from gateway.tools.quarantine import LogReader
from gateway.tools.story import INPUT_NAMES, read_type, told
from store.port import EventStore

_CANDIDATES = frozenset().union(*JUMP_TYPES.values())


@dataclass(slots=True)
class StoryIndex:
    """One agent stream's groups and jumps, up to ``version``."""

    reader: LogReader
    version: int = 0
    """The stream's events indexed."""
    starts: array[int] = field(default_factory=lambda: array("q"))
    """Each group's input: its log position, in order..."""
    start_versions: array[int] = field(default_factory=lambda: array("q"))
    """... and its stream version."""
    jumps: dict[str, array[int]] = field(
        default_factory=lambda: {kind: array("q") for kind in JUMP_KINDS})
    """The positions of the decisions of each jump kind, in order."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def around(self, position: int, count: int) -> tuple[int, int, int]:
        """The groups [first, end) of the one holding ``position`` (the last input at or
        before it) with ``count`` each side, and the index of that one among them (-1:
        none)."""
        holding = bisect_right(self.starts, position) - 1
        first = max(0, holding - count)
        end = min(len(self.starts), max(holding, 0) + count + 1)
        return first, end, holding - first if holding >= 0 else -1

    def between(self, start: int, upto: int, limit: int) -> tuple[int, int, bool]:
        """The first ``limit`` groups [first, end) with their input in [``start``,
        ``upto``], and whether there are more."""
        first, after = bisect_left(self.starts, start), bisect_right(self.starts, upto)
        return first, min(after, first + limit), after - first > limit

    def jump(self, kind: str, after: int | None, before: int | None) -> int | None:
        """The position of the first decision of ``kind`` after ``after``, or of the last one
        before ``before`` (None: there is none)."""
        positions = self.jumps[kind]
        if after is not None:
            found = bisect_right(positions, after)
            return positions[found] if found < len(positions) else None
        assert before is not None
        found = bisect_left(positions, before) - 1
        return positions[found] if found >= 0 else None


class Stories:
    """Each agent's `StoryIndex` (the least recently asked for let go past `MAX_STREAMS`)."""

    def __init__(self, streams: int = MAX_STREAMS) -> None:
        self._indexes: OrderedDict[str, StoryIndex] = OrderedDict()
        self._streams = streams

    async def index(self, store: EventStore, reader: LogReader, agent_id: str) -> StoryIndex:
        """The agent's index, up to date with what its stream holds now."""
        index = self._indexes.get(agent_id)
        if index is None or index.reader is not reader:
            index = self._indexes[agent_id] = StoryIndex(reader)
            while len(self._indexes) > self._streams:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(agent_id)
        # (under the lock: two catch-ups of the same new events would count them twice)
        async with index.lock, aclosing(steps(store, agent_id, index.version)) as reading:
            async for step in reading:
                for record in step:
                    type_name = read_type(record, reader)
                    if type_name in INPUT_NAMES:
                        index.starts.append(record.position)
                        index.start_versions.append(record.version)
                    elif type_name in _CANDIDATES:
                        for kind in kinds_of(reader.decode(record)):
                            if kind in index.jumps:
                                index.jumps[kind].append(record.position)
                    index.version = record.version
        return index

    async def groups(self, store: EventStore, index: StoryIndex, agent_id: str, first: int,
                     end: int) -> list[Group]:
        """Groups [first, end) of the agent's ``index``, read from the log and worded."""
        if first >= end:
            return []
        low = index.start_versions[first]
        high = index.start_versions[end] - 1 if end < len(index.starts) else index.version
        records = await store.read_stream(agent_id, after_version=low - 1,
                                          limit=high - low + 1)
        bounds = [v - low for v in index.start_versions[first:end]] + [len(records)]
        return told(records, pairwise(bounds), index.reader)
