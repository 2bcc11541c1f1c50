"""The runtime core of a stream (`gateway.runtime.core.StreamCore`), alone, on a fake clock: decide,
append, settle; after a failed append, a rebuild from the log whose backoff is measured on
the clock, never in real time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import pytest

from gateway.base.clock import FakeClock
from gateway.base.quarantine import PLAIN
from gateway.runtime.core import (
    READ_RETRY_MS,
    REBUILD_BACKOFF_MAX_MS,
    Commit,
    EventIds,
    StreamCore,
    rebuild_backoff_ms,
)
from gateway.runtime.phases import Phase
from lanes import AgentState, decide, replay
from lanes.codec import AGENT_CODEC
from lanes.events import Decision, Input, RequestQueued, RequestReceived
from store import (
    Append,
    Fence,
    FencedError,
    MemoryEventStore,
    RecordedEvent,
    StoreError,
    WriteFailed,
)
from tests.gateway.support import TIMEOUT, request


class Flaky(MemoryEventStore):
    """A memory log whose appends fail while ``refusing`` and whose next ``unreadable``
    reads of a stream fail, as a locked or failing database's do."""

    refusing = False
    unreadable = 0

    def append(self, append: Append) -> Commit:
        if not self.refusing:
            return super().append(append)
        future: Commit = asyncio.get_running_loop().create_future()
        future.get_loop().call_soon(future.set_exception,
                                    WriteFailed("the batch", "the event log is locked"))
        return future

    async def read_stream(self, stream: str, after_version: int = 0,
                          limit: int | None = None) -> list[RecordedEvent]:
        if self.unreadable:
            self.unreadable -= 1
            raise StoreError("could not read the event log: locked")
        return await super().read_stream(stream, after_version, limit)


class Heard:
    """A listener that writes down what it is told."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.rebuilds = asyncio.Queue[int]()

    def committed(self, decisions: list[Decision], records: list[RecordedEvent],
                  seconds: float, urgent: bool) -> None:
        self.said.append(f"committed {len(records)}")

    def failed(self, decisions: list[Decision], error: BaseException | None) -> None:
        self.said.append("failed")

    def lost(self) -> None:
        self.said.append("lost")

    def rebuilt(self, records: list[RecordedEvent]) -> None:
        self.said.append(f"rebuilt from {len(records)}")
        self.rebuilds.put_nowait(len(records))

    def due(self) -> None:
        self.said.append("due")

    def fenced(self, error: FencedError) -> None:
        self.said.append(f"fenced: now {error.holder}")


class Phased(Protocol):
    """A stream core, or what holds one (a provider gate)."""

    @property
    def phase(self) -> Phase: ...


def phase(stream: Phased) -> Phase:
    """Its phase now (read through a call: mypy would keep an asserted one narrowed)."""
    return stream.phase


def fold_a(records: Sequence[RecordedEvent]) -> AgentState:
    return replay(PLAIN.entries(records)).get("a") or AgentState(agent_id="a")


@pytest.fixture
async def store() -> Flaky:
    flaky = Flaky()
    await flaky.open()
    return flaky


def core_of(store: Flaky, clock: FakeClock, heard: Heard
            ) -> StreamCore[AgentState, Input, Decision]:
    return StreamCore("a", AgentState(agent_id="a"), store=store, clock=clock,
                      codec=AGENT_CODEC, decide=decide, rebuild=fold_a, listener=heard,
                      ids=EventIds("t"), pending=set(), rebuilds=set())


def received(clock: FakeClock) -> RequestReceived:
    return RequestReceived(at=clock.now_ms(), request=request("a"))


async def turns() -> None:
    """Let everything ready run (a few turns of the loop), to see what did not happen."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_an_append_of_a_lease_lost_is_fenced_and_never_rebuilt_to_write_again(
    store: Flaky,
) -> None:
    clock, heard = FakeClock(), Heard()
    core = core_of(store, clock, heard)
    await store.join("m1", 60_000)
    await store.join("m2", 60_000)
    core.fence = Fence("m1", (await store.acquire("m1", ["a"]))["a"])
    first = core.feed(received(clock)).commit
    assert first is not None
    await asyncio.wait_for(first, TIMEOUT)
    await store.release("m1", ["a"])
    await store.acquire("m2", ["a"])  # another process took it
    late = core.feed(received(clock)).commit
    assert late is not None
    with pytest.raises(FencedError):
        await asyncio.wait_for(late, TIMEOUT)
    await turns()
    assert heard.said[1:] == ["failed", f"fenced: now {Fence('m2', 2)}"]
    assert phase(core) is Phase.LIVE and heard.rebuilds.empty()


def test_the_backoff_doubles_from_the_second_failure_up_to_its_cap() -> None:
    assert [rebuild_backoff_ms(n) for n in range(1, 8)] == [0, 50, 100, 200, 400, 500, 500]
    assert rebuild_backoff_ms(60) == REBUILD_BACKOFF_MAX_MS


async def test_an_input_is_decided_appended_and_settled(store: Flaky) -> None:
    clock, heard = FakeClock(), Heard()
    core = core_of(store, clock, heard)
    outcome = core.feed(received(clock))
    assert [type(d) for d in outcome.decisions][:1] == [RequestQueued]
    assert outcome.commit is not None
    records = await asyncio.wait_for(outcome.commit, TIMEOUT)
    await turns()
    assert heard.said == [f"committed {len(records)}"] and core.version == len(records)


async def test_failed_appends_rebuild_after_a_backoff_on_the_clock_alone(store: Flaky) -> None:
    clock, heard = FakeClock(), Heard()
    core = core_of(store, clock, heard)
    first = core.feed(received(clock)).commit
    assert first is not None
    stored = len(await asyncio.wait_for(first, TIMEOUT))
    store.refusing = True
    core.feed(received(clock))
    assert await asyncio.wait_for(heard.rebuilds.get(), TIMEOUT) == stored  # the first: at once
    assert core.failures == 1 and phase(core) is Phase.LIVE
    core.feed(received(clock))  # fails again: the second rebuild waits 50 ms of the clock
    await turns()
    assert phase(core) is Phase.REBUILDING and core.failures == 2 and heard.rebuilds.empty()
    clock.advance(49)
    await turns()
    assert heard.rebuilds.empty()
    store.refusing = False
    clock.advance(1)
    assert await asyncio.wait_for(heard.rebuilds.get(), TIMEOUT) == stored
    assert phase(core) is Phase.LIVE and core.state == fold_a(await store.read_stream("a"))
    core.feed(received(clock))
    await turns()
    assert core.failures == 0 and heard.said[-1].startswith("committed")
    assert heard.said.count("lost") == 2 and heard.said.count("failed") == 2


async def test_a_rebuild_reads_again_after_the_clock_says_so(store: Flaky) -> None:
    clock, heard = FakeClock(), Heard()
    core = core_of(store, clock, heard)
    store.refusing, store.unreadable = True, 2
    core.feed(received(clock))
    await turns()
    # read once, failed; waits on the clock
    assert phase(core) is Phase.REBUILDING and store.unreadable == 1
    store.refusing = False
    clock.advance(READ_RETRY_MS - 1)
    await turns()
    assert store.unreadable == 1
    clock.advance(1)
    await turns()
    assert store.unreadable == 0  # read again, failed again
    clock.advance(READ_RETRY_MS)
    assert await asyncio.wait_for(heard.rebuilds.get(), TIMEOUT) == 0
    assert phase(core) is Phase.LIVE


async def test_a_timer_fires_at_its_time_and_not_while_the_stream_is_rebuilt(
        store: Flaky) -> None:
    clock, heard = FakeClock(), Heard()
    core = core_of(store, clock, heard)
    core.schedule(clock.now_ms() + 100)
    core.schedule(clock.now_ms() + 100)  # the same time: one timer
    clock.advance(99)
    assert "due" not in heard.said
    clock.advance(1)
    assert heard.said == ["due"]
    core.schedule(clock.now_ms() + 100)
    store.refusing = True
    core.feed(received(clock))  # fails: the rebuild cancels the timer
    await asyncio.wait_for(heard.rebuilds.get(), TIMEOUT)
    clock.advance(1_000)
    assert heard.said.count("due") == 1
