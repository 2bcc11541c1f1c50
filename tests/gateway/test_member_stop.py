"""A cluster member's graceful stop (a memory log with leases, a fake clock): every stream
whose lease it holds is handed over with its run in flight recorded ended, however long the
hand-over takes and whatever it was still loading. The last member of a cluster to stop has
nobody to take over a run it leaves open (`bench.cluster.check_runs`: every run ended)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.cluster.adoption import catch_up
from gateway.cluster.member import Cluster
from gateway.cluster.router import Router
from gateway.runtime.core import Commit
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode
from lanes import replay as fold
from lanes.events import AbortReason, RunAborted
from store import Append
from tests.gateway.support import ManualReasoner, request, until
from tests.gateway.test_clustered_engine import router
from tests.gateway.test_core import Flaky

TIMEOUT = 5.0
LEASE_MS = 1_000
TURNS = 50
"""Loop turns given to the member after each move of the clock (a renewal takes a few)."""


class Slow(Flaky):
    """A memory log on a fake clock whose commits of stream ``held`` wait until `go` (a
    log slowed down by load)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock.now_ms)
        self.held: str | None = None
        self._waiting: list[tuple[Append, Commit]] = []

    def append(self, append: Append) -> Commit:
        if append.stream != self.held:
            return super().append(append)
        future: Commit = asyncio.get_running_loop().create_future()
        self._waiting.append((append, future))
        return future

    def go(self) -> None:
        """Commit what waited, and everything from now on at once."""
        self.held = None
        for append, waiting in self._waiting:
            super().append(append).add_done_callback(partial(_settle, waiting))
        self._waiting.clear()


def _settle(waiting: Commit, done: Commit) -> None:
    error = done.exception()
    if error is not None:
        waiting.set_exception(error)
    else:
        waiting.set_result(done.result())


async def engine_of(store: Flaky, clock: FakeClock, reasoner: ManualReasoner,
                    agents: tuple[str, ...]) -> Engine:
    """A started engine of a cluster member on ``store``, ``agents`` in followup."""
    engine = Engine(store, {agent: AgentConfig(mode=Mode.FOLLOWUP) for agent in agents},
                    clock=clock, reasoners=lambda _: reasoner, elsewhere=router(),
                    snapshot_every=None)
    await engine.start()
    return engine


async def member_of(engine: Engine, port: int) -> Cluster:
    """``engine`` as a started member of its log's cluster."""
    assert isinstance(engine.elsewhere, Router)
    member = Cluster(engine, engine.elsewhere, f"http://127.0.0.1:{port}", lease_ms=LEASE_MS,
                     clock=engine.clock)
    await member.start()
    return member


async def open_runs(store: Flaky, engine: Engine) -> dict[str, str]:
    """The runs the log leaves open, by agent (what the next owner would find cut off)."""
    states = fold(engine.reader.entries(await store.read()))
    return {agent: state.active.run_id for agent, state in states.items()
            if state.active is not None}


async def turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


async def test_a_stop_longer_than_the_rest_of_the_lease_still_records_every_run_ended(
) -> None:
    """The lease is renewed until the hand-over is done. (A member stopped under the full
    suite's load took longer than what was left of its lease to hand its agents over: its
    watchdog dropped the agents not handed over yet, and the log kept their runs open.)"""
    clock = FakeClock()
    store, reasoner = Slow(clock), ManualReasoner()
    engine = await engine_of(store, clock, reasoner, ("a", "b"))
    member = await member_of(engine, 1)
    try:
        assert member.owned == ["a", "b"]
        for agent in ("a", "b"):
            await asyncio.wait_for(engine.submit(request(agent)), TIMEOUT)
            await reasoner.started()
        assert set(await open_runs(store, engine)) == {"a", "b"}
        store.held = "a"  # its hand-over waits for the log
        stopping = asyncio.ensure_future(member.stop())
        for _ in range(3 * LEASE_MS // (member.period_ms // 2)):  # three leases go by
            clock.advance(member.period_ms // 2)
            await turns()
        store.go()
        await asyncio.wait_for(stopping, TIMEOUT)
        assert engine.loaded == []
        assert await open_runs(store, engine) == {}
        aborted = [e.event for e in engine.reader.entries(await store.read())
                   if isinstance(e.event, RunAborted)]
        assert {e.reason for e in aborted} == {AbortReason.SHUTDOWN} and len(aborted) == 2
    finally:
        await member.stop()
        await engine.stop()


async def test_a_member_stopped_while_it_loads_an_agent_records_its_cut_off_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent whose lease the stopping member took (its owner died) is loaded and handed
    over like the others: the run its owner was cut off in is recorded aborted (restart),
    not left open for a member that may never come."""
    clock = FakeClock()
    dead, reasoner = ManualReasoner(), ManualReasoner()
    # Its owner died in a run (a log with the run open), its lease not run out yet.
    earlier = Flaky(clock=clock.now_ms)
    gone = Engine(earlier, {"a": AgentConfig(mode=Mode.FOLLOWUP)}, clock=clock,
                  reasoners=lambda _: dead, snapshot_every=None)
    await gone.start()
    await asyncio.wait_for(gone.submit(request("a")), TIMEOUT)
    await dead.started()
    await gone.stop(graceful=False)
    store = Flaky(clock=clock.now_ms, committed=await earlier.read())
    engine = await engine_of(store, clock, reasoner, ("a",))
    await store.join("m0", 600_000)
    await store.acquire("m0", ["a"])
    member = await member_of(engine, 2)  # "a" is the live m0's: nothing to take
    loading = asyncio.Event()

    async def slow_catch_up(*args: Any) -> Any:
        await loading.wait()
        return await catch_up(*args)

    monkeypatch.setattr("gateway.cluster.takeover.catch_up", slow_catch_up)
    try:
        assert member.owned == [] and await open_runs(store, engine) == {"a": "a-r1"}
        await store.renew("m0", 0)  # m0 is dead: "a" is free
        member.poke()

        async def taken() -> bool:
            return member.adopting == ["a"]

        await until(taken, "the member took the dead owner's agent and loads it")
        stopping = asyncio.ensure_future(member.stop())
        await turns()
        loading.set()
        await asyncio.wait_for(stopping, TIMEOUT)
        assert await open_runs(store, engine) == {}
        reasons = [e.event.reason for e in engine.reader.entries(await store.read())
                   if isinstance(e.event, RunAborted)]
        # Cut off (restart) and run again, then handed over (shutdown).
        assert reasons == [AbortReason.RESTART, AbortReason.SHUTDOWN]
    finally:
        loading.set()
        await member.stop()
        await engine.stop()
