"""Cost per decision with 10 and with 10,000 agents (goal: flat), memory per agent
(tracemalloc's count for the pure state, and the resident memory of a live engine process),
and how long the reads of a big desk hold the event loop (`loop_stalls`).

    uv run python -m bench.scale [--requests N] [--agents N] [--asks K] [--only_stalls 1]

The loop-stall probe serves a gateway of ``--agents`` agents (SQLite, every agent with a
finished run) in this process, and asks each read a big desk makes ``K`` times, one at a
time, from a client in another process (its parsing never runs in the server's loop): a
WebSocket subscribe's snapshot, ``GET /api/agents``, an agent's story and moment (time
travel), and ``/metrics``. Meanwhile a task sleeps 1 ms over and over and notes the longest
the loop ran something else between two of its turns (where an emergency stop's frame
would wait), in the loop thread's CPU time (so that other processes on a busy machine do
not count) and in wall-clock lateness; and the heaviest single callback the loop ran
meanwhile, named by its task's coroutine (a stall may be several callbacks of one turn, and
not all of them the read's: the schedules' pass over every agent, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from bench.common import Figure, requests, run, timed
from bench.throughput import Hang
from gateway.base.process import tune_runtime
from gateway.config import validate_config
from gateway.edge.server import serving
from gateway.runtime.engine import Engine
from gateway.runtime.intake import take_all
from gateway.wiring import build_service
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


TOKEN = "bench-viewer-token-0123456789"
READS = ("subscribe snapshot", "agent list", "story", "moment", "metrics")
"""The reads the loop-stall probe asks, by the names of its figures."""
STALL_GOAL_MS = 5.0


@contextlib.contextmanager
def callback_holds() -> Iterator[Callable[[], list[tuple[float, str]]]]:
    """While in the block, every callback the (asyncio) event loop runs is timed in the
    loop thread's CPU time; a function returns, since it was last called, the longest
    callback (ms) of each task (named by its coroutine; a plain callback by itself), the
    heaviest first, and starts again. A stall is every callback the loop ran in one turn,
    and not all of them are the read's: this names them."""
    run = asyncio.events.Handle._run
    longest: dict[str, float] = {}

    def timed_run(handle: asyncio.events.Handle) -> None:
        began = time.thread_time()
        run(handle)
        held = time.thread_time() - began
        callback = handle._callback  # type: ignore[attr-defined]
        owner = getattr(callback, "__self__", None)
        what = owner.get_coro() if isinstance(owner, asyncio.Task) else callback
        name = getattr(what, "__qualname__", type(what).__name__)
        if held > longest.get(name, 0.0):
            longest[name] = held

    def take() -> list[tuple[float, str]]:
        found = sorted(((held * 1000, name) for name, held in longest.items()), reverse=True)
        longest.clear()
        return found

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign,assignment]
    try:
        yield take
    finally:
        asyncio.events.Handle._run = run  # type: ignore[method-assign]


@asynccontextmanager
async def stall_probe(tick: float = 0.001) -> AsyncIterator[Callable[[], tuple[float, float]]]:
    """A task that sleeps ``tick`` over and over and notes the longest it woke late (the
    longest the loop went without a turn); a function that returns that in ms and starts
    again, twice: the loop thread's CPU time between two wakes (what the loop ran meanwhile:
    the machine's other load does not count) and the wall-clock lateness."""
    loop = asyncio.get_running_loop()
    longest = [0.0, 0.0]

    async def watch() -> None:
        while True:
            began, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(tick)
            longest[0] = max(longest[0], time.thread_time() - cpu)
            longest[1] = max(longest[1], loop.time() - began - tick)

    def take() -> tuple[float, float]:
        held, late = longest
        longest[:] = [0.0, 0.0]
        return held * 1000, late * 1000

    task = asyncio.create_task(watch())
    await asyncio.sleep(tick * 2)
    try:
        yield take
    finally:
        task.cancel()


def _ask(url: str, read: str, times: int) -> tuple[float, int]:
    """In the client's process: ``read`` asked ``times`` times one after the other; the
    slowest answer (ms) and the size of the last (characters)."""
    import httpx2
    from websockets.sync.client import connect

    agent = "agent0"
    paths = {"agent list": "/api/agents", "metrics": "/metrics",
             "story": f"/api/agents/{agent}/story", "moment": f"/api/agents/{agent}/moment"}
    slowest, size = 0.0, 0
    with httpx2.Client(base_url=url, timeout=600,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for _ in range(times):
            began = time.perf_counter()
            if read == "subscribe snapshot":
                ws_url = url.replace("http", "ws", 1) + "/ws/control"
                with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"},
                             max_size=None) as ws:
                    ws.send('{"type":"subscribe","id":"s"}')
                    text = ws.recv(timeout=600)
                    while '"snapshot"' not in str(text)[:40]:
                        text = ws.recv(timeout=600)
                    size = len(text)
            else:
                answer = http.get(paths[read])
                answer.raise_for_status()
                size = len(answer.content)
            slowest = max(slowest, (time.perf_counter() - began) * 1000)
    return slowest, size


async def loop_stalls(agents: int, asks: int) -> list[Figure]:
    """The longest event-loop stall while each of `READS` is asked ``asks`` times at
    ``agents`` agents (see the module)."""
    names = [f"agent{n}" for n in range(agents)]
    loop = asyncio.get_running_loop()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp, \
            ProcessPoolExecutor(max_workers=1,
                                mp_context=multiprocessing.get_context("spawn")) as client:
        db = Path(tmp, "events.db")
        config = validate_config({
            "server": {"host": "127.0.0.1", "port": 0}, "store": {"path": str(db)},
            "tokens": [{"name": "bench", "token": TOKEN, "role": "viewer"}],
            "agents": [{"id": name, "mode": "followup",
                        "reasoner": {"latency_ms": [1, 5], "trade_probability": 0.0}}
                       for name in names]}, "<bench>")
        async with serving(build_service(config, db)) as running:
            engine = running.service.engine
            for start in range(0, agents, 100):  # one run each, finished
                await take_all(engine, requests(names[start:start + 100], 100))
            for _ in range(6_000):  # their runs take 1 to 5 ms each
                if not any(engine.state(a).active or engine.state(a).pending for a in names):
                    break
                await asyncio.sleep(0.05)
            gc.collect()
            gc.freeze()
            async with stall_probe() as stall:
                with callback_holds() as heaviest:
                    for read in READS:
                        await loop.run_in_executor(client, _ask, running.url, read, 1)  # warm
                        stall()
                        heaviest()
                        slowest, size = await loop.run_in_executor(
                            client, _ask, running.url, read, asks)
                        held, late = stall()
                        tasks = heaviest()[:3]
                        figures += [
                            Figure(f"{read}: longest event-loop stall (loop thread's CPU)",
                                   held, "ms", f"<= {STALL_GOAL_MS:g} ms"),
                            Figure(f"{read}: ... wall clock (counts this busy machine's "
                                   "other load)", late, "ms"),
                            Figure(f"{read}: ... the heaviest callbacks, by task: " + ", ".join(
                                f"{name} {ms:.1f} ms" for ms, name in tasks), tasks[0][0], "ms"),
                            Figure(f"{read}: slowest answer ({size:,} characters)", slowest,
                                   "ms")]
    return figures


def measure(count: int = 200_000, agents: int = 10_000, asks: int = 5,
            only_stalls: int = 0) -> list[Figure]:
    """Per-decision costs at both scales and their ratio; memory per agent; the loop-stall
    probe (`loop_stalls`: ``asks`` of each read at ``agents`` agents)."""
    stalls = [Figure(f"event-loop stall probe, {agents:,} agents, {asks} asks of each read",
                     agents, "agents"), *asyncio.run(loop_stalls(agents, asks))]
    if only_stalls:
        return stalls
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
        *stalls,
    ]


if __name__ == "__main__":
    run(measure, requests=200_000, agents=10_000, asks=5, only_stalls=0)
