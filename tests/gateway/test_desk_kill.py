"""`gateway.runtime.desk.desk_kill`: every agent's stop taken in one step, one record with
each agent's effect or error, and a log that replays and verifies clean around it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.runtime.acks import Ack
from gateway.runtime.desk import KILL_PREFIX, RECORD_TYPE, desk_kill, read_kill
from gateway.runtime.effects import ControlEffect
from gateway.runtime.engine import Engine
from gateway.runtime.intake import Batch
from lanes import AgentConfig, AgentRequest
from lanes.events import TradingState
from lanes.replay import Verifier
from lanes.streams import DESK_STREAM
from store import MemoryEventStore
from tests.gateway.support import ManualReasoner, log_of, request


class Recording:
    """A way in that notes each `take` and answers only when told."""

    def __init__(self) -> None:
        self.takes: list[list[AgentRequest]] = []
        self.futures: list[asyncio.Future[Ack]] = []
        self.taken = asyncio.Event()

    def take(self, requests: Sequence[AgentRequest], principal: str | None,
             batch: Batch | None = None, parsed: bool = False) -> list[asyncio.Future[Ack]]:
        self.takes.append(list(requests))
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in requests]
        self.futures += futures
        self.taken.set()
        return futures

    def finish(self, batch: Batch) -> None:
        pass


async def test_every_agents_stop_is_sent_before_any_is_answered() -> None:
    engine = Engine(MemoryEventStore(), {})
    await engine.start()
    try:
        way_in = Recording()
        agents = [f"a{n}" for n in range(30)]
        killing = asyncio.create_task(desk_kill(engine, way_in, agents, "ops", "test"))
        await asyncio.wait_for(way_in.taken.wait(), 5)
        assert len(way_in.takes) == 1  # all at once, not one after another's commit
        [sent] = way_in.takes
        assert [r.agent_id for r in sent] == agents
        assert {r.request_id for r in sent} == {sent[0].request_id}
        assert sent[0].request_id.startswith(KILL_PREFIX)
        assert all(r.action is not None and r.action.value == "emergency_stop" for r in sent)
        halted = ControlEffect(from_state=TradingState.ACTIVE, to_state=TradingState.HALTED,
                               changed=True)
        for n, future in enumerate(way_in.futures):
            future.set_result(Ack(sent[0].request_id, "accepted", n + 1, effect=halted))
        kill = await killing
        assert kill.halted == 30 and kill.principal == "ops" and kill.reason == "test"
    finally:
        await engine.stop()


async def test_a_kill_records_each_agents_effect_and_refused_ids_and_verifies_clean() -> None:
    store = MemoryEventStore()
    reasoner = ManualReasoner()
    engine = Engine(store, {"a": AgentConfig(), "b": AgentConfig()}, reasoners=lambda _: reasoner)
    await engine.start()
    try:
        await engine.submit(request("a"))
        await reasoner.started()
        kill = await desk_kill(engine, engine, ["a", "b", "ghost"], "ops", None,
                               scope=["a", "b", "ghost"])
        await engine.flush()
    finally:
        await engine.stop()
    by_agent = {a.agent_id: a for a in kill.agents}
    assert by_agent["a"].effect is not None and by_agent["a"].effect.aborted_run is not None
    assert by_agent["b"].effect is not None and by_agent["b"].effect.changed
    assert by_agent["ghost"].error == "unknown_agent" and by_agent["ghost"].effect is None
    assert kill.halted == 2
    [record] = await store.read_stream(DESK_STREAM)
    assert record.type == RECORD_TYPE and record.position == kill.position
    assert read_kill(record.data) == kill.model_copy(update={"position": None})
    verifier = Verifier()
    verifier.feed(await log_of(store))  # the desk stream is no agent's: read past
    assert verifier.finish() is None
    assert verifier.inputs > 0
