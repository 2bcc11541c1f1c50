"""Reading a stream a step at a time, and folds of streams kept up to date by reading only
what was appended since: the read models time travel and the agent page ask for again and
again (`gateway.reads.replays`, `gateway.reads.stories`, the call trees). Each is a
cache of the log, never the source of truth; each step leaves the event loop free for the
next emergency stop (reading a long stream in one go held it for seconds).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.base.quarantine import LogReader
from store.port import LogReads, RecordedEvent

READ_PAGE = 1_000
"""Events read from a stream at a time (making the records of a page holds the loop too)."""
FOLD_STEP = 200
"""Events decoded and folded between two turns of the event loop (a few ms)."""
MAX_STREAMS = 16
"""Streams kept by each read model (the least recently asked for goes first)."""

T = TypeVar("T")


async def steps(store: LogReads, stream: str, after_version: int
                ) -> AsyncGenerator[list[RecordedEvent], None]:
    """The stream's records after ``after_version``, `FOLD_STEP` at a time, read `READ_PAGE`
    at a time, the event loop's other work running before each step."""
    while True:
        page = await store.read_stream(stream, after_version=after_version, limit=READ_PAGE)
        for start in range(0, len(page), FOLD_STEP):
            await asyncio.sleep(0)
            yield page[start:start + FOLD_STEP]
        if len(page) < READ_PAGE:
            return
        after_version = page[-1].version


@dataclass(slots=True)
class _Tail(Generic[T]):
    reader: LogReader
    value: T
    version: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class StreamFolds(Generic[T]):
    """A fold per stream (``fresh`` makes one, ``add`` folds a record into it), each up to
    date with its stream when asked for."""

    def __init__(self, fresh: Callable[[LogReader], T],
                 add: Callable[[T, LogReader, RecordedEvent], object],
                 streams: int = MAX_STREAMS,
                 weigh: Callable[[T], int] | None = None, budget: int = 0) -> None:
        """``weigh``: a fold's size in bytes; the folds kept weigh at most ``budget`` in
        all (the one just asked for is kept whatever it weighs)."""
        self._fresh, self._add = fresh, add
        self._tails: OrderedDict[str, _Tail[T]] = OrderedDict()
        self._streams, self._weigh, self._budget = streams, weigh, budget

    async def get(self, store: LogReads, reader: LogReader, stream: str) -> tuple[T, int]:
        """``stream``'s fold, up to date with what the stream holds now (decoded by
        ``reader``, which knows the events set aside), and the stream version it is at."""
        tail = self._tails.get(stream)
        if tail is None or tail.reader is not reader:
            tail = self._tails[stream] = _Tail(reader, self._fresh(reader))
            while len(self._tails) > self._streams:
                self._tails.popitem(last=False)
        self._tails.move_to_end(stream)
        # (under the lock: two catch-ups of the same new events would fold them twice)
        async with tail.lock, aclosing(steps(store, stream, tail.version)) as reading:
            async for step in reading:
                for record in step:
                    self._add(tail.value, reader, record)
                    tail.version = record.version  # (one that raises is not counted in)
        weigh = self._weigh
        if weigh is not None:
            total = sum(weigh(kept.value) for kept in self._tails.values())
            while total > self._budget and len(self._tails) > 1:
                _, dropped = self._tails.popitem(last=False)
                total -= weigh(dropped.value)
        return tail.value, tail.version
