"""Adopting an agent in a cluster (a memory log with leases, a fake clock): the lease is renewed
while an adoption is slow, the agent answers ``unavailable`` until it is loaded, and it is
loaded from its replica plus the tail of its stream, a chunk at a time."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.clock import FakeClock
from gateway.base.quarantine import PLAIN
from gateway.cluster import adoption
from gateway.cluster.adoption import catch_up, copy_state
from gateway.cluster.member import Cluster
from gateway.cluster.peers import Peers
from gateway.cluster.router import Router
from gateway.errors import TakingOver
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentState, Mode
from lanes import replay as fold
from lanes.codec import AGENT_CODEC
from lanes.events import ConfigChanged
from store import Append, LeaseView, NewEvent, RecordedEvent
from tests.gateway.support import ManualReasoner, request, until
from tests.gateway.test_core import Flaky

TIMEOUT = 5.0


class Stalling(Flaky):
    """A memory log whose stream reads wait while ``stall`` is set and not released, and
    that counts renewals and stream reads."""

    stall: asyncio.Event | None = None
    broken = 0
    """Stream reads that fail with an unexpected error (not a `StoreError`)."""
    renewals = 0
    reads: list[tuple[str, int, int | None]]

    async def read_stream(self, stream: str, after_version: int = 0,
                          limit: int | None = None) -> list[RecordedEvent]:
        if self.stall is not None:
            await self.stall.wait()
        if self.broken:
            self.broken -= 1
            raise RuntimeError("a bug somewhere below")
        self.reads.append((stream, after_version, limit))
        return await super().read_stream(stream, after_version, limit)

    async def renew(self, member: str, lease_ms: int) -> LeaseView:
        self.renewals += 1
        return await super().renew(member, lease_ms)


async def member_of(store: Stalling, clock: FakeClock, reasoner: ManualReasoner,
                    lease_ms: int) -> tuple[Engine, Cluster]:
    through = Router(Peers("test-secret"))
    engine = Engine(store, {"a": AgentConfig(mode=Mode.FOLLOWUP)}, clock=clock,
                    reasoners=lambda _: reasoner, elsewhere=through, snapshot_every=None)
    await engine.start()
    member = Cluster(engine, through, "http://127.0.0.1:1", lease_ms=lease_ms, clock=clock)
    await member.start()
    return engine, member


async def test_the_lease_is_renewed_while_an_adoption_is_slow() -> None:
    store, clock, reasoner = Stalling(), FakeClock(), ManualReasoner()
    store.reads = []
    engine, member = await member_of(store, clock, reasoner, lease_ms=1_000)
    try:
        assert member.owned == ["a"]
        # As if an append had been fenced: the agent is adopted again, and its stream's
        # read stalls (a long stream, a slow database).
        store.stall = asyncio.Event()
        member.fenced("a")
        engine.holding.drop("a")

        async def adopting() -> bool:
            return "a" in member._adopting and any(
                not t.done() for t in ([member._adopter] if member._adopter else []))

        await until(adopting, "the adoption of a under way")
        assert member.replicas._holds("a")  # its replica stays as it is: copied, not folded
        # Three lease times go by: every period the lease is renewed all the same.
        for _ in range(3 * 1_000 // member.period_ms):
            before = store.renewals
            clock.advance(member.period_ms)

            async def renewed(before: int = before) -> bool:
                return store.renewals > before

            await until(renewed, "a renewal while the adoption waits", TIMEOUT)
        assert member._watchdog is not None  # never fired: the lease held throughout
        # Until it is loaded, the agent is unavailable here (typed: retry shortly).
        with pytest.raises(TakingOver):
            await asyncio.wait_for(engine.submit(request("a")), TIMEOUT)
        store.stall.set()
        await asyncio.wait_for(member.adopted(), TIMEOUT)
        assert member.owned == ["a"] and engine.loaded == ["a"]
        ack = await asyncio.wait_for(engine.submit(request("a", requestId="r2")), TIMEOUT)
        assert ack.decision == "accepted"
    finally:
        if store.stall is not None:
            store.stall.set()
        await member.stop()
        await engine.stop()


async def test_an_adoption_that_fails_unexpectedly_gives_the_lease_back_and_is_retried(
) -> None:
    store, clock, reasoner = Stalling(), FakeClock(), ManualReasoner()
    store.reads = []
    engine, member = await member_of(store, clock, reasoner, lease_ms=600_000)
    try:
        member._fences.pop("a")  # as if it had been lost and is taken up again
        engine.holding.drop("a")
        store.broken = 1
        await asyncio.wait_for(member.tick(), TIMEOUT)
        assert member.owned == [] and "a" not in (await store.leases()).holders
        await asyncio.wait_for(member.tick(), TIMEOUT)  # the next round takes it up
        assert member.owned == ["a"] and engine.loaded == ["a"]
    finally:
        await member.stop()
        await engine.stop()


async def test_an_agent_is_adopted_from_its_replica_and_the_tail_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adoption, "CHUNK", 3)
    store, clock, reasoner = Stalling(), FakeClock(), ManualReasoner()
    store.reads = []
    engine, member = await member_of(store, clock, reasoner, lease_ms=600_000)
    try:
        for n in range(4):
            await asyncio.wait_for(engine.submit(request("a", dedupeKey=f"k{n}")), TIMEOUT)
        await engine.flush()
        records = await store.read_stream("a")
        whole = fold(engine.reader.entries(records))["a"]
        replica = fold(engine.reader.entries(records[:3]))["a"]  # behind the log
        store.reads = []
        adopted = await catch_up(store, engine.reader, "a", replica, None)
        assert adopted.state.version == whole.version == len(records)
        assert copy_state(adopted.state) == whole == adopted.state
        assert replica.version == 3  # the replica itself is left as it was
        # Only what the replica lacks is read, a chunk at a time.
        assert store.reads[0] == ("a", 3, 3)
        assert all(limit == 3 for _, _, limit in store.reads)
        assert len(store.reads) == -(-(len(records) - 3) // 3) + (
            1 if (len(records) - 3) % 3 == 0 else 0)
    finally:
        await member.stop()
        await engine.stop()


async def test_the_config_files_entry_is_applied_again_only_if_it_changed() -> None:
    store = Stalling()
    store.reads = []
    old, new = AgentConfig(mode=Mode.FOLLOWUP), AgentConfig(mode=Mode.QUEUE)

    def changed(config: AgentConfig, principal: str, version: int) -> Append:
        type_name, data = AGENT_CODEC.encode(
            ConfigChanged(at=1, config=config, principal=principal))
        return Append("a", [NewEvent(f"e{version}", type_name, data)], version)

    await store.open()
    await store.append(changed(old, "config", 0))
    await store.append(changed(new, "operator", 1))
    other = AgentConfig(mode=Mode.COLLECT)
    # The file's entry is the one it last gave (an operator's came after): kept as it is.
    assert not (await catch_up(store, PLAIN, "a", None, old)).file_changed
    assert (await catch_up(store, PLAIN, "a", None, other)).file_changed
    # From a replica that has both events already (no tail): looked for further back.
    replica = (await catch_up(store, PLAIN, "a", None, None)).state
    assert replica.version == 2 and replica.config not in (old, other)
    store.reads = []
    assert not (await catch_up(store, PLAIN, "a", replica, old)).file_changed
    assert [after for _, after, _ in store.reads] == [2, 0]  # the (empty) tail, then back
    assert (await catch_up(store, PLAIN, "a", replica, other)).file_changed
    assert not (await catch_up(store, PLAIN, "a", AgentState(agent_id="a"), None)).file_changed
