"""Folds of streams kept up to date (`gateway.reads.tails.StreamFolds`): each ask folds
only what was appended, a record that cannot be folded is not counted in, and the folds kept
stay within their count and byte budget."""

from __future__ import annotations

import pytest

from gateway.base.quarantine import PLAIN, LogReader
from gateway.reads.tails import StreamFolds
from store import MemoryEventStore, RecordedEvent


def record(position: int, stream: str, version: int, size: int = 10) -> RecordedEvent:
    return RecordedEvent(position, stream, version, f"e{position}", "Note", "x" * size,
                         position)


async def store_of(*streams: tuple[str, int]) -> MemoryEventStore:
    """A log with ``count`` records of each ``(stream, count)``, one stream after another."""
    store = MemoryEventStore()
    await store.open()
    records, position = [], 0
    for stream, count in streams:
        for version in range(1, count + 1):
            position += 1
            records.append(record(position, stream, version))
    await store.restore(records)
    return store


def positions() -> StreamFolds[list[int]]:
    """Each stream's positions; a fold weighs 10 bytes a record."""

    def add(seen: list[int], _reader: LogReader, added: RecordedEvent) -> None:
        seen.append(added.position)

    return StreamFolds(lambda _reader: [], add, weigh=lambda seen: 10 * len(seen), budget=250)


async def test_each_ask_folds_only_what_was_appended_since() -> None:
    store = await store_of(("a", 7))
    folds = positions()
    assert await folds.get(store, PLAIN, "a") == ([1, 2, 3, 4, 5, 6, 7], 7)
    await store.restore([record(8, "a", 8), record(9, "b", 1), record(10, "a", 9)])
    assert await folds.get(store, PLAIN, "a") == ([1, 2, 3, 4, 5, 6, 7, 8, 10], 9)


async def test_the_folds_kept_stay_within_the_budget_but_the_one_asked_for_is_kept() -> None:
    store = await store_of(("a", 10), ("b", 10), ("c", 30))
    folds = positions()
    await folds.get(store, PLAIN, "a")
    await folds.get(store, PLAIN, "b")  # 200 bytes in all: both kept
    assert list(folds._tails) == ["a", "b"]
    await folds.get(store, PLAIN, "a")
    await folds.get(store, PLAIN, "c")  # 300 bytes alone: kept, the others go
    assert list(folds._tails) == ["c"]


async def test_a_record_that_cannot_be_folded_is_not_counted_in() -> None:
    store = await store_of(("a", 5))
    broken = {3}

    def add(seen: list[int], _reader: LogReader, added: RecordedEvent) -> None:
        if added.position in broken:
            raise ValueError("unreadable")
        seen.append(added.position)

    folds: StreamFolds[list[int]] = StreamFolds(lambda _reader: [], add)
    with pytest.raises(ValueError, match="unreadable"):
        await folds.get(store, PLAIN, "a")
    broken.clear()
    assert await folds.get(store, PLAIN, "a") == ([1, 2, 3, 4, 5], 5)
