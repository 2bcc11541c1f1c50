"""The contract suite against the in-memory store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from store import GroupCommitStore, MemoryEventStore, open_store
from store.writer import DEFAULT_FOLLOWER_BUFFER, DEFAULT_MAX_BATCH

from .contract import EventStoreContract, StoreFactory, app, wait


class TestMemoryEventStore(EventStoreContract):
    @pytest.fixture
    def make_store(self) -> StoreFactory:
        def make(
            *,
            clock: Callable[[], int] | None = None,
            max_batch: int = DEFAULT_MAX_BATCH,
            follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        ) -> GroupCommitStore:
            return MemoryEventStore(
                clock=clock, max_batch=max_batch, follower_buffer=follower_buffer
            )

        return make


async def test_reads_work_after_close() -> None:
    store = MemoryEventStore()
    await store.open()
    recorded = await wait(store.append(app("s")))
    await store.close()
    assert await store.read() == recorded


async def test_open_store_memory() -> None:
    store = await open_store("memory:")
    try:
        assert isinstance(store, MemoryEventStore)
        assert store.is_open
    finally:
        await store.close()
    assert not store.is_open


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        MemoryEventStore(max_batch=0)
    with pytest.raises(ValueError, match="follower_buffer"):
        MemoryEventStore(follower_buffer=0)
