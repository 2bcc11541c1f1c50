"""Where time travel's story finds things in an agent's stream (``/story``,
``/story/find``): where each group (an input and the decisions it caused) starts, and where
each stop, drop and suppression is, kept up to date by reading only what was appended
since (`gateway.reads.tails`). A story then reads and words only the groups it shows.
Each index also keeps the symbol of each order placed, so that a fill read without its order
is worded to its symbol's tick. Also each agent's sub-agent call events, for its call trees.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import pairwise

from gateway.base.quarantine import LogReader
from gateway.market.prices import PriceWords
from gateway.reads.story import INPUT_NAMES, read_type, told
from gateway.reads.tails import StreamFolds
from gateway.tools.timeline import JUMP_KINDS, JUMP_TYPES, Group, kinds_of
from lanes.calltree import CALL_EVENT_TYPES
from lanes.events import Event
from store.port import LogReads, RecordedEvent

_CANDIDATES = frozenset().union(*JUMP_TYPES.values())
_PLACING = frozenset({"OrderAccepted", "ApprovalRequested"})


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
    orders: OrderedDict[str, str] = field(default_factory=OrderedDict)
    """Each order's symbol (`PriceWords.orders`)."""

    def add(self, record: RecordedEvent) -> None:
        """Index the stream's next record."""
        type_name = read_type(record, self.reader)
        if type_name in INPUT_NAMES:
            self.starts.append(record.position)
            self.start_versions.append(record.version)
        elif type_name in _PLACING:
            PriceWords(orders=self.orders).learn(self.reader.decode(record))
        elif type_name in _CANDIDATES:
            for kind in kinds_of(self.reader.decode(record)):
                if kind in self.jumps:
                    self.jumps[kind].append(record.position)
        self.version = record.version

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
    """Each agent's `StoryIndex`."""

    def __init__(self) -> None:
        self._indexes: StreamFolds[StoryIndex] = StreamFolds(
            StoryIndex, lambda index, _reader, record: index.add(record))

    async def index(self, store: LogReads, reader: LogReader, agent_id: str) -> StoryIndex:
        """The agent's index, up to date with what its stream holds now."""
        return (await self._indexes.get(store, reader, agent_id))[0]

    async def groups(self, store: LogReads, index: StoryIndex, agent_id: str, first: int,
                     end: int, words: PriceWords | None = None) -> list[Group]:
        """Groups [first, end) of the agent's ``index``, read from the log and worded (prices
        to the ticks of ``words``)."""
        if first >= end:
            return []
        low = index.start_versions[first]
        high = index.start_versions[end] - 1 if end < len(index.starts) else index.version
        records = await store.read_stream(agent_id, after_version=low - 1,
                                          limit=high - low + 1)
        bounds = [v - low for v in index.start_versions[first:end]] + [len(records)]
        return told(records, pairwise(bounds), index.reader,
                    (words or PriceWords()).with_orders(index.orders))


CALL_STREAMS = 256
CALL_BYTES = 32 * 2**20
"""Streams whose call events are kept, and their stored size in all: a tree spans many
agents (each keeps only its call events, few beside its stream, but a call's result holds
the answer)."""


@dataclass(slots=True)
class CallLog:
    """One agent's sub-agent call events, decoded, in its stream's order."""

    events: list[Event] = field(default_factory=list)
    size: int = 0
    """Their stored size (bytes of JSON)."""


def call_events() -> StreamFolds[CallLog]:
    """Each agent's `CallLog` (what `lanes.calltree.CallTrees` folds: the agent page asks
    for them up to once a second)."""

    def add(calls: CallLog, reader: LogReader, record: RecordedEvent) -> None:
        if record.type in CALL_EVENT_TYPES:
            calls.events.append(reader.decode(record))
            calls.size += len(record.data)

    return StreamFolds(lambda _reader: CallLog(), add, streams=CALL_STREAMS,
                       weigh=lambda calls: calls.size, budget=CALL_BYTES)
