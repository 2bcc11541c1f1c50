"""Cost per decision with 10 and with 10,000 agents (goal: flat), and memory per agent.

    uv run python -m bench.scale [--requests N]
"""

from __future__ import annotations

import asyncio
import tracemalloc

from bench.common import Figure, requests, run, timed
from bench.throughput import Hang
from gateway.engine import Engine
from gateway.runtime import tune_gc
from lanes import AgentConfig, AgentState, Mode, decide
from lanes.events import ConfigChanged, RequestReceived
from store import MemoryEventStore

CONFIG = AgentConfig(mode=Mode.FOLLOWUP, cap=20)
"""Every agent is first filled to its cap, so every measured request does the same work at
both scales: received, the oldest pending dropped, the new one queued."""


def pure_decide_us(agents: int, count: int, grouped: bool = False) -> float:
    """Microseconds per `decide` of a request, requests spread over ``agents`` agents
    round-robin (every decision touches a cold state), or ``grouped`` by agent."""
    names = [f"agent{n}" for n in range(agents)]
    states = {name: AgentState(agent_id=name) for name in names}
    for state in states.values():
        decide(state, ConfigChanged(at=0, config=CONFIG))
    for n, request in enumerate(requests(names, agents * CONFIG.cap)):
        decide(states[request.agent_id], RequestReceived(at=n, request=request))
    fresh = requests(names, count)
    if grouped:
        fresh.sort(key=lambda r: r.agent_id)
    batch = [RequestReceived(at=agents * CONFIG.cap + n, request=r)
             for n, r in enumerate(fresh)]
    tune_gc()
    with timed() as elapsed:
        for event in batch:
            decide(states[event.request.agent_id], event)
    return elapsed[0] / count * 1e6


async def engine_us(agents: int, count: int) -> float:
    """Microseconds per request through the engine (memory store, frames of 100)."""
    names = [f"agent{n}" for n in range(agents)]
    engine = Engine(MemoryEventStore(), dict.fromkeys(names, CONFIG), reasoners=lambda _: Hang())
    await engine.start()
    await engine.submit_many(requests(names, agents * CONFIG.cap))
    batch = requests(names, count)
    tune_gc()
    with timed() as elapsed:
        for start in range(0, count, 100):
            await engine.submit_many(batch[start:start + 100])
    await engine.stop()
    return elapsed[0] / count * 1e6


def bytes_per_agent(agents: int = 10_000) -> float:
    """Memory of an agent's state with its config and a full queue."""
    names = [f"agent{n}" for n in range(agents)]
    batch = requests(names, agents * CONFIG.cap)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    states = {name: AgentState(agent_id=name) for name in names}
    for state in states.values():
        decide(state, ConfigChanged(at=0, config=CONFIG))
    for n, request in enumerate(batch):
        decide(states[request.agent_id], RequestReceived(at=1 + n, request=request))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / agents


def measure(count: int = 200_000) -> list[Figure]:
    """Per-decision costs at both scales and their ratio."""
    small = pure_decide_us(10, count)
    large = pure_decide_us(10_000, count)
    grouped = pure_decide_us(10_000, count, grouped=True)
    small_engine = asyncio.run(engine_us(10, count))
    large_engine = asyncio.run(engine_us(10_000, count))
    return [
        Figure("decide, 10 agents", small, "us/request"),
        Figure("decide, 10,000 agents", large, "us/request"),
        Figure("decide: 10,000 / 10 agents", large / small, "x", "flat (~1)"),
        Figure("decide, 10,000 agents, each agent's requests back to back", grouped,
               "us/request"),
        Figure("engine (memory store), 10 agents", small_engine, "us/request"),
        Figure("engine (memory store), 10,000 agents", large_engine, "us/request"),
        Figure("engine: 10,000 / 10 agents", large_engine / small_engine, "x", "flat (~1)"),
        Figure(f"memory per agent with {CONFIG.cap} pending requests",
               bytes_per_agent() / 1024, "KiB"),
    ]


if __name__ == "__main__":
    run(measure, requests=200_000)
