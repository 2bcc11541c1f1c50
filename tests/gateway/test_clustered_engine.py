"""An engine beside other processes (a memory log with leases, a fake clock): it decides for
what it is given (`Engine.load`), unloads gracefully even while the log refuses writes, and
never writes for an agent it does not hold (replicas of the others: `tests/cluster`)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.clock import FakeClock
from gateway.cluster.member import Cluster
from gateway.cluster.peers import Peers
from gateway.cluster.router import Router
from gateway.errors import NotOwner, StorageFailed
from gateway.runtime.acks import Ack
from gateway.runtime.core import Commit
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentRequest, Mode
from lanes import replay as fold
from lanes.events import RunAborted, RunStarted
from store import Append, Fence, WriteFailed
from tests.gateway.support import ManualReasoner, control, request, until
from tests.gateway.test_core import Flaky

TIMEOUT = 5.0


def router() -> Router:
    return Router(Peers("test-secret"))


async def clustered(store: Flaky, clock: FakeClock, reasoner: ManualReasoner,
                    through: Router | None = None) -> Engine:
    engine = Engine(store, {"a": AgentConfig(mode=Mode.FOLLOWUP)}, clock=clock,
                    reasoners=lambda _: reasoner, elsewhere=through or router(),
                    snapshot_every=None)
    await engine.start()
    return engine


async def adopted(engine: Engine, store: Flaky, member: str = "m1", agent: str = "a") -> Fence:
    await store.join(member, 600_000)
    fence = Fence(member, (await store.acquire(member, [agent]))[agent])
    engine.holding.load(agent, await store.read_stream(agent), fence)
    return fence


async def test_an_agent_is_refused_until_adopted_and_served_after() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    try:
        with pytest.raises(NotOwner):
            await engine.submit(request("a"))  # nobody to forward to: typed, retryable
        assert engine.loaded == []
        await adopted(engine, store)
        ack = await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        assert ack.decision == "accepted" and engine.loaded == ["a"]
        records = await store.read_stream("a")
        assert {r.event_id.split("-")[0] for r in records} == {engine.ids.prefix}  # type: ignore[union-attr]
    finally:
        await engine.stop()


async def test_an_unload_records_the_run_aborted_and_requeues_its_requests() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = await clustered(store, clock, reasoner)
    try:
        await adopted(engine, store)
        await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        await reasoner.started()
        await asyncio.wait_for(engine.holding.unload("a"), TIMEOUT)
        assert engine.loaded == []
        entries = engine.reader.entries(await store.read_stream("a"))
        state = fold(entries)["a"]  # what the next process starts from
        assert state.active is None and len(state.pending) == 1  # requeued for the next owner
        events = [type(entry.event).__name__ for entry in entries]
        assert events.count(RunStarted.__name__) == 1 and RunAborted.__name__ in events
    finally:
        await engine.stop()


async def test_an_unload_ends_while_the_log_refuses_writes_and_nothing_is_written_after(
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
        await asyncio.wait_for(engine.holding.unload("a"), TIMEOUT)  # no endless rebuilds
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


async def test_an_unload_waits_for_its_own_agent_only() -> None:
    store, clock, reasoner = Stalling(), FakeClock(), ManualReasoner()
    engine = Engine(store, {"a": AgentConfig(), "b": AgentConfig()}, clock=clock,
                    reasoners=lambda _: reasoner, elsewhere=router(), snapshot_every=None)
    await engine.start()
    try:
        await store.join("m1", 600_000)
        held = await store.acquire("m1", ["a", "b"])
        for agent in ("a", "b"):
            engine.holding.load(agent, await store.read_stream(agent), Fence("m1", held[agent]))
        stuck = asyncio.ensure_future(engine.submit(request("b")))  # never committed
        await asyncio.wait_for(engine.holding.unload("a"), TIMEOUT)  # not held up by b's
        assert engine.loaded == ["b"] and not stuck.done()
    finally:
        for future in store.stalled:  # it fails in the end: nothing stays in flight
            future.set_exception(WriteFailed("the batch", "stalled"))
        await asyncio.gather(stuck, return_exceptions=True)
        for agent in engine.loaded:
            engine.holding.drop(agent)
        await engine.stop()


async def test_a_stream_whose_lease_is_held_but_not_owned_is_taken_up_again() -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    through = router()
    engine = await clustered(store, clock, reasoner, through)
    member = Cluster(engine, through, "http://127.0.0.1:1", lease_ms=600_000, clock=clock)
    await member.start()
    try:
        assert member.owned == ["a"] and engine.loaded == ["a"]
        # As if its adoption had failed after the lease was taken (and its release too):
        # the lease says this member holds it, so no other member would ever take it.
        member._fences.pop("a")
        engine.holding.drop("a")
        assert engine.loaded == []
        await member.tick()
        assert member.owned == ["a"] and engine.loaded == ["a"]
    finally:
        await member.stop()
        await engine.stop()


async def test_an_engine_beside_others_never_stores_a_snapshot_of_the_agents_it_holds() -> None:
    """It holds only some agents: a snapshot of its states would lose the others' at the
    next start (only a worker process, folding the whole log, may store one then)."""
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    engine = Engine(store, {"a": AgentConfig(mode=Mode.FOLLOWUP), "b": AgentConfig()},
                    clock=clock, reasoners=lambda _: reasoner, elsewhere=router(),
                    snapshot_every=1)
    await engine.start()
    try:
        await adopted(engine, store)
        for n in range(3):
            await asyncio.wait_for(engine.submit(request("a", dedupeKey=f"k{n}")), TIMEOUT)
        await engine.flush()
    finally:
        await engine.stop()
    assert await store.snapshots() == []


async def test_an_agent_whose_append_was_fenced_reads_as_the_log_says() -> None:
    """Fenced (another member holds its lease now), the agent leaves the engine and its
    replica is read from the log again: no reader is shown the state it had before it was
    taken, nor the decisions of the refused append."""
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    through = router()
    engine = await clustered(store, clock, reasoner, through)
    member = Cluster(engine, through, "http://127.0.0.1:1", lease_ms=600_000, clock=clock)
    await member.start()
    try:
        await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        await store.leave(member.member)  # its leases go to another member
        await store.join("m2", 600_000)
        assert "a" in await store.acquire("m2", ["a"])
        with pytest.raises(NotOwner):
            await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        assert engine.loaded == []
        version = (await store.read_stream("a"))[-1].version

        async def caught_up() -> bool:
            return engine.state("a").version == version

        await until(caught_up, "the replica of the fenced agent read from the log")
    finally:
        await member.stop()
        await engine.stop()


class Passing(Router):
    """A router that takes what the engine sends on to another process, and says so."""

    def __init__(self) -> None:
        super().__init__(Peers("test-secret"))
        self.passed: asyncio.Queue[tuple[AgentRequest, str | None]] = asyncio.Queue()

    async def forward(self, request: AgentRequest, principal: str | None = None) -> Ack:
        await self.passed.put((request, principal))
        return Ack(request.request_id, "accepted", 1)


@pytest.mark.parametrize("leaving", ["unload", "drop"])
async def test_controls_held_when_the_agent_leaves_go_to_its_next_process(
    leaving: str,
) -> None:
    store, clock, reasoner = Flaky(), FakeClock(), ManualReasoner()
    through = Passing()
    engine = await clustered(store, clock, reasoner, through)
    try:
        await adopted(engine, store)
        store.refusing = True
        stop = control("a", "emergency_stop")
        with pytest.raises(StorageFailed) as answered:
            await engine.submit(stop, "alice")  # (the store fails it a loop turn later)
        agent = engine.present("a")
        assert answered.value.held and agent is not None and agent.controls
        if leaving == "unload":
            await asyncio.wait_for(engine.holding.unload("a"), TIMEOUT)
        else:
            engine.holding.drop("a")
        passed = await asyncio.wait_for(through.passed.get(), TIMEOUT)
        assert passed == (stop, "alice")  # with its principal, for the next process to store
    finally:
        await engine.stop()
