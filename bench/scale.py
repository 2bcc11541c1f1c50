"""Cost per decision with 10 and with 10,000 agents (goal: flat), and memory per agent:
tracemalloc's count for the pure state, and the resident memory of a live engine process.

    uv run python -m bench.scale [--requests N] [--agents N]
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import tempfile
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.common import Figure, requests, run, timed
from bench.throughput import Hang
from gateway.base.process import tune_runtime
from gateway.runtime.engine import Engine
from gateway.runtime.intake import take_all
from lanes import AgentConfig, AgentState, Mode, decide
from lanes.events import ConfigChanged, RequestReceived
from store import MemoryEventStore, SqliteEventStore

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
    tune_runtime()
    with timed() as elapsed:
        for event in batch:
            decide(states[event.request.agent_id], event)
    return elapsed[0] / count * 1e6


async def engine_us(agents: int, count: int) -> float:
    """Microseconds per request through the engine (memory store, frames of 100)."""
    names = [f"agent{n}" for n in range(agents)]
    engine = Engine(MemoryEventStore(), dict.fromkeys(names, CONFIG), reasoners=lambda _: Hang())
    await engine.start()
    await take_all(engine, requests(names, agents * CONFIG.cap))
    batch = requests(names, count)
    tune_runtime()
    with timed() as elapsed:
        for start in range(0, count, 100):
            await take_all(engine, batch[start:start + 100])
    await engine.stop()
    return elapsed[0] / count * 1e6


def bytes_per_agent(agents: int = 10_000) -> float:
    """Memory of an agent's state with its config and a full queue, the queued requests
    themselves included (they are built while traced)."""
    names = [f"agent{n}" for n in range(agents)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    batch = requests(names, agents * CONFIG.cap)
    states = {name: AgentState(agent_id=name) for name in names}
    for state in states.values():
        decide(state, ConfigChanged(at=0, config=CONFIG))
    for n, request in enumerate(batch):
        decide(states[request.agent_id], RequestReceived(at=1 + n, request=request))
    del batch  # the list itself is not state; its requests are, and stay referenced
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / agents


def memory_kib(field: str = "VmRSS") -> int:
    """A memory figure of this process from Linux's ``/proc/self/status``, KiB: ``VmRSS``
    resident now, ``VmHWM`` the peak. (Not ``getrusage``: its peak carries over the parent's
    across the fork and exec that start a process.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


async def live_engine(agents: int) -> tuple[int, int, int]:
    """Resident KiB of this process with a started engine (SQLite, ``synchronous=FULL``,
    ``agents`` agents configured), then once each agent has a run in flight and a full
    queue, and the peak (KiB)."""
    names = [f"agent{n}" for n in range(agents)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(SqliteEventStore(Path(tmp, "events.db")), dict.fromkeys(names, CONFIG),
                        reasoners=lambda _: Hang())
        await engine.start()
        gc.collect()
        started = memory_kib()
        # One request per agent starts its run; CONFIG.cap more fill its queue. Built per
        # frame, so no list of every request outlives the filling.
        for _ in range(CONFIG.cap + 1):
            for start in range(0, agents, 100):
                await take_all(engine, requests(names[start:start + 100], 100))
        assert all(len(engine.state(a).pending) == CONFIG.cap and engine.state(a).active
                   for a in names)
        gc.collect()
        live = memory_kib()
        await engine.stop()
    return started, live, memory_kib("VmHWM")


def live_rss(agents: int) -> tuple[int, int, int]:
    """`live_engine` in a process of its own (spawned: nothing else in it grew first)."""
    with ProcessPoolExecutor(max_workers=1,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_live_rss, agents).result()


def _live_rss(agents: int) -> tuple[int, int, int]:
    return asyncio.run(live_engine(agents))


def measure(count: int = 200_000, agents: int = 10_000) -> list[Figure]:
    """Per-decision costs at both scales and their ratio; memory per agent."""
    small = pure_decide_us(10, count)
    large = pure_decide_us(10_000, count)
    grouped = pure_decide_us(10_000, count, grouped=True)
    small_engine = asyncio.run(engine_us(10, count))
    large_engine = asyncio.run(engine_us(10_000, count))
    started, live, peak = live_rss(agents)
    return [
        Figure("decide, 10 agents", small, "us/request"),
        Figure("decide, 10,000 agents", large, "us/request"),
        Figure("decide: 10,000 / 10 agents", large / small, "x", "flat (~1)"),
        Figure("decide, 10,000 agents, each agent's requests back to back", grouped,
               "us/request"),
        Figure("engine (memory store), 10 agents", small_engine, "us/request"),
        Figure("engine (memory store), 10,000 agents", large_engine, "us/request"),
        Figure("engine: 10,000 / 10 agents", large_engine / small_engine, "x", "flat (~1)"),
        Figure(f"pure state per agent with {CONFIG.cap} pending requests (tracemalloc)",
               bytes_per_agent() / 1024, "KiB"),
        Figure(f"live engine process (SQLite store), {agents:,} agents each with a run in "
               f"flight and {CONFIG.cap} queued: resident memory", live / 1024, "MiB"),
        Figure("... grown from the started engine to that, per agent",
               (live - started) / agents, "KiB"),
        Figure("... peak resident memory of that process", peak / 1024, "MiB"),
    ]


if __name__ == "__main__":
    run(measure, requests=200_000, agents=10_000)
