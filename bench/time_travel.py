"""Time travel on one long agent stream: what a pick in the panel costs, and how long it
holds the event loop (where an emergency stop would wait).

    uv run python -m bench.time_travel [--events N] [--picks K]

One agent with ``N`` events (`bench.replay_speed.make_log`) in a SQLite file, served by a
gateway in this process. ``K`` picks at random positions ask ``/moment`` over HTTP, one at a
time, then the same positions as the panel asks at a pick (``/api/replay``, ``/moment`` and
``/story`` at once), while a task notes the longest the event loop went without a turn. In
the same run, the way before checkpoints (`gateway.reads.replays`) for the same positions:
read the whole stream, fold it up to the position.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2

from bench.common import Figure, run
from bench.replay_speed import _write, make_log
from gateway.base.quarantine import PLAIN
from gateway.config import validate_config
from gateway.edge.server import serving
from gateway.wiring import build_service
from lanes import AgentState
from lanes.codec import encode
from lanes.evolve import fold
from store import SqliteEventStore

TOKEN = "bench-viewer-token-0123456789"
AGENT = "agent0"


def measure(events: int = 100_000, picks: int = 20) -> list[Figure]:
    """The figures (see the module)."""
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(_measure(Path(tmp) / "travel.db", events, picks))


@asynccontextmanager
async def _stalls() -> AsyncIterator[Callable[[], float]]:
    """A task that notes the event loop's longest wait for a turn; a function that returns
    it in ms (and starts again)."""
    loop = asyncio.get_running_loop()
    longest = [0.0]
    tick = 0.002

    async def watch() -> None:
        while True:
            began = loop.time()
            await asyncio.sleep(tick)
            longest[0] = max(longest[0], loop.time() - began - tick)

    def take() -> float:
        value, longest[0] = longest[0], 0.0
        return value * 1000

    task = asyncio.create_task(watch())
    try:
        yield take
    finally:
        task.cancel()


async def _measure(db: Path, events: int, picks: int) -> list[Figure]:
    log = make_log(events, agents=1)
    await _write(db, [(e.position, e.stream, *encode(e.event)) for e in log])
    last = log[-1].position
    rng = random.Random(3)
    positions = [rng.randrange(1, last + 1) for _ in range(picks)]
    config = validate_config({
        "server": {"host": "127.0.0.1", "port": 0}, "store": {"path": str(db)},
        "tokens": [{"name": "bench", "token": TOKEN, "role": "viewer"}],
        "agents": [{"id": AGENT, "mode": "followup"}]}, "<bench>")
    first_ms = 0.0
    pick_ms: list[float] = []
    panel_ms: list[float] = []
    stall_ms: list[float] = []
    async with serving(build_service(config, db)) as running, \
            httpx2.AsyncClient(base_url=running.url, timeout=600,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
            _stalls() as stall:
        for n, position in enumerate([last // 2, *positions]):
            began = time.perf_counter()
            answer = await http.get(f"/api/agents/{AGENT}/moment", params={"position": position})
            took = (time.perf_counter() - began) * 1000
            answer.raise_for_status()
            if n == 0:
                first_ms = took
                stall()
            else:
                pick_ms.append(took)
                stall_ms.append(stall())
        for position in positions:  # as the panel asks at a pick: three at once
            began = time.perf_counter()
            answers = await asyncio.gather(
                http.get("/api/replay", params={"agent": AGENT, "position": position,
                                                "around": 20}),
                http.get(f"/api/agents/{AGENT}/moment", params={"position": position}),
                http.get(f"/api/agents/{AGENT}/story", params={"at": position, "around": 3}))
            panel_ms.append((time.perf_counter() - began) * 1000)
            for answer in answers:
                answer.raise_for_status()
            stall_ms.append(stall())
    store = SqliteEventStore(db)
    await store.open()
    before_ms, before_stall_ms = [], []
    try:
        async with _stalls() as stall:
            for position in positions:
                began = time.perf_counter()
                records = await store.read_stream(AGENT)
                fold(AgentState(agent_id=AGENT),
                     [PLAIN.decode(r) for r in records if r.position <= position])
                before_ms.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(0)
                before_stall_ms.append(stall())
    finally:
        await store.close()
    after, before = statistics.median(pick_ms), statistics.median(before_ms)
    return [
        Figure(f"one agent's stream ({picks} picks at random positions)", len(log), "events"),
        Figure("first pick: folds the whole stream once, keeping checkpoints", first_ms, "ms"),
        Figure("later picks, p50 (HTTP /moment)", after, "ms"),
        Figure("later picks, max", max(pick_ms), "ms"),
        Figure("a pick as the panel asks (replay, moment and story at once), p50",
               statistics.median(panel_ms), "ms"),
        Figure("longest event-loop stall during later picks", max(stall_ms), "ms", "< 50 ms"),
        Figure("before (read the stream, fold to the position; no HTTP), p50", before, "ms"),
        Figure("before: longest event-loop stall", max(before_stall_ms), "ms"),
        Figure("pick p50, before / now", before / after, "x"),
    ]


if __name__ == "__main__":
    run(measure, events=100_000, picks=20)
