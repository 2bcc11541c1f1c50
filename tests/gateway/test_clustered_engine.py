"""A clustered engine on its own (a memory log with leases, a fake clock): it owns what it
adopts, keeps replicas of the rest, hands over gracefully even while the log refuses
writes, and never writes for an agent it does not own (replicas: `tests/cluster`)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.clock import FakeClock
from gateway.errors import NotOwner, StorageFailed
from gateway.runtime.cluster import Cluster
from gateway.runtime.core import Commit
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode
from lanes.events import RunAborted, RunStarted
from store import Append, Fence, WriteFailed
from tests.gateway.support import ManualReasoner, request
from tests.gateway.test_core import Flaky

TIMEOUT = 5.0


async def clustered(store: Flaky, clock: FakeClock, reasoner: ManualReasoner) -> Engine:
    engine = Engine(store, {"a": AgentConfig(mode=Mode.FOLLOWUP)}, clock=clock,
                    reasoners=lambda _: reasoner, clustered=True, snapshot_every=None)
    await engine.start()
    return engine


async def adopted(engine: Engine, store: Flaky, member: str = "m1") -> Fence:
    await store.join(member, 600_000)
    fence = Fence(member, (await store.acquire(member, ["a"]))["a"])
    await engine.adopt("a", fence)
    return fence


async def test_an_agent_is_refused_until_adopted_and_served_after() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    try:
        with pytest.raises(NotOwner):
            await engine.submit(request("a"))  # nobody to forward to: typed, retryable
        assert engine.owned == []
        await adopted(engine, store)
        ack = await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        assert ack.decision == "accepted" and engine.owned == ["a"]
        records = await store.read_stream("a")
        assert {r.event_id.split("-")[0] for r in records} == {engine.ids.prefix}  # type: ignore[union-attr]
    finally:
        await engine.stop()


async def test_a_hand_over_records_the_run_aborted_and_leaves_a_replica() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    try:
        await adopted(engine, store)
        await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        await reasoner.started()
        await asyncio.wait_for(engine.hand_over("a"), TIMEOUT)
        assert engine.owned == []
        state = engine.state("a")  # the replica: exactly the log
        assert state.active is None and len(state.pending) == 1  # requeued for the next owner
        events = [type(entry.event).__name__
                  for entry in engine.reader.entries(await store.read_stream("a"))]
        assert events.count(RunStarted.__name__) == 1 and RunAborted.__name__ in events
    finally:
        await engine.stop()


async def test_a_hand_over_ends_while_the_log_refuses_writes_and_nothing_is_written_after(
) -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    try:
        await adopted(engine, store)
        await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        await reasoner.started()
        store.refusing = True
        with pytest.raises(StorageFailed):
            await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        await asyncio.wait_for(engine.hand_over("a"), TIMEOUT)  # no endless rebuilds
        written = len(await store.read())
        store.refusing = False
        for _ in range(50):  # a rebuild finishing now must not write for an agent not owned
            clock.advance(100)
            await asyncio.sleep(0)
        assert len(await store.read()) == written
        with pytest.raises(NotOwner):
            await engine.submit(request("a"))
    finally:
        await engine.stop()


class Stalling(Flaky):
    """A memory log whose commits of stream ``b`` never come (a commit stuck elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled: list[Commit] = []

    def append(self, append: Append) -> Commit:
        if append.stream == "b":
            future: Commit = asyncio.get_running_loop().create_future()
            self.stalled.append(future)
            return future
        return super().append(append)


async def test_a_hand_over_waits_for_its_own_agent_only() -> None:
    store, clock, reasoner = Stalling(), FakeClock(), ManualReasoner()
    engine = Engine(store, {"a": AgentConfig(), "b": AgentConfig()}, clock=clock,
                    reasoners=lambda _: reasoner, clustered=True, snapshot_every=None)
    await engine.start()
    try:
        await store.join("m1", 600_000)
        held = await store.acquire("m1", ["a", "b"])
        for agent in ("a", "b"):
            await engine.adopt(agent, Fence("m1", held[agent]))
        stuck = asyncio.ensure_future(engine.submit(request("b")))  # never committed
        await asyncio.wait_for(engine.hand_over("a"), TIMEOUT)  # not held up by b's
        assert engine.owned == ["b"] and not stuck.done()
    finally:
        for future in store.stalled:  # it fails in the end: nothing stays in flight
            future.set_exception(WriteFailed("the batch", "stalled"))
        await asyncio.gather(stuck, return_exceptions=True)
        for agent in engine.owned:
            engine.lose(agent)
        await engine.stop()


async def test_a_stream_whose_lease_is_held_but_not_owned_is_taken_up_again() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    member = Cluster(engine, "http://127.0.0.1:1", lease_ms=600_000, clock=clock)
    await member.start()
    try:
        assert member.owned == ["a"] and engine.owned == ["a"]
        # As if its adoption had failed after the lease was taken (and its release too):
        # the lease says this member holds it, so no other member would ever take it.
        member._fences.pop("a")
        engine.lose("a")
        assert engine.owned == []
        await member.tick()
        assert member.owned == ["a"] and engine.owned == ["a"]
    finally:
        await member.stop()
        await engine.stop()
