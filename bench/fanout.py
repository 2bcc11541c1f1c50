"""Event delivery to subscribers over WebSocket: one `event` frame per event against
`events` frames (``subscribe`` with ``batch: true``), measured in the same run.

The gateway runs in this process (uvicorn on 127.0.0.1, an ephemeral port, SQLite with
``synchronous=FULL``); the subscribers run in a child process, so the server has a core of
its own. The log is filled first (``hook_trigger`` requests queued behind runs that never
end); then each subscriber subscribes to every agent from position 0 and reads, decoding
every frame with ``json.loads``, until it has the last event. That is the path a subscriber
that fell behind (or a panel that just opened) takes, through the same encoder and sender
as live events.

    uv run python -m bench.fanout [--requests N] [--agents N] [--subscribers N]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from websockets.asyncio.client import connect

from bench.common import Figure, run
from bench.ws_ingest import (
    CONTROL_TOKEN,
    TIMEOUT,
    Hang,
    _first,
    agent_names,
    gateway,
    request_json,
)
from gateway.client import ControlClient
from gateway.runtime.intake import take_all
from lanes import AgentConfig, Mode, parse_request


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the subscribers of one run received."""

    seconds: float
    events: int
    frames: int


def subscribers_read(url: str, batch: bool, subscribers: int, last: int) -> Delivery:
    """In a child process: ``subscribers`` connections read the whole log; the wall time
    until the last of them has the event at ``last``."""
    return asyncio.run(_read_all(f"{url}/ws/control", batch, subscribers, last))


async def _read_all(url: str, batch: bool, subscribers: int, last: int) -> Delivery:
    async def one() -> tuple[int, int]:
        async with connect(url, additional_headers={"Authorization": f"Bearer {CONTROL_TOKEN}"},
                           compression=None, max_size=16 << 20) as ws:
            assert json.loads(await ws.recv())["type"] == "hello"
            await ws.send(json.dumps({"type": "subscribe", "after": 0, "batch": batch}))
            assert json.loads(await ws.recv())["type"] == "snapshot"
            events = frames = position = 0
            while position < last:
                frame = json.loads(await ws.recv())
                if frame["type"] == "heartbeat":  # a quiet moment (a busy machine)
                    continue
                frames += 1
                got = frame["events"] if batch else [frame]
                events += len(got)
                position = got[-1]["position"]
            return events, frames

    start = time.perf_counter()
    done = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(subscribers))),
                                  TIMEOUT)
    return Delivery(time.perf_counter() - start, sum(e for e, _ in done),
                    sum(f for _, f in done))


def client_reads(url: str, last: int) -> Delivery:
    """In a child process: one `gateway.client` subscription (pydantic-checked frames)."""
    return asyncio.run(_through_client(url, last))


async def _through_client(url: str, last: int) -> Delivery:
    async with ControlClient(url, CONTROL_TOKEN) as client:
        start = time.perf_counter()
        events = 0
        async with client.subscribe(after=0) as subscription:
            async for event in subscription:
                events += 1
                if event.position >= last:
                    break
        return Delivery(time.perf_counter() - start, events, 0)


async def _measure(count: int, agents: int, subscribers: int,
                   pool: ProcessPoolExecutor) -> tuple[int, dict[str, Delivery]]:
    loop = asyncio.get_running_loop()
    names = agent_names(agents)
    config = AgentConfig(mode=Mode.FOLLOWUP, cap=count // agents + 10)
    runs: dict[str, Delivery] = {}
    await loop.run_in_executor(pool, partial(Delivery, 0.0, 0, 0))  # start the child
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway(Path(tmp, "fanout.db"), dict.fromkeys(names, config),
                           lambda _: Hang()) as (url, engine):
            for n, name in enumerate(names):  # every agent busy: what follows queues
                await engine.submit(_first(name, n))
            for start in range(0, count, 1000):
                await take_all(
                    engine, [parse_request(json.loads(request_json("f", n, names[n % agents])))
                     for n in range(start, min(count, start + 1000))], "bench")
            await engine.flush()
            last = await engine.store.last_position()
            for name, batch, readers in (("event frames, 1 subscriber", False, 1),
                                         ("events frames, 1 subscriber", True, 1),
                                         (f"events frames, {subscribers} subscribers", True,
                                          subscribers)):
                runs[name] = await loop.run_in_executor(
                    pool, partial(subscribers_read, url, batch, readers, last))
                if runs[name].events != readers * last:
                    raise AssertionError(f"{name}: {runs[name].events} events of "
                                         f"{readers * last}")
            runs["gateway.client"] = await loop.run_in_executor(
                pool, partial(client_reads, url, last))
    return last, runs


def measure(count: int = 50_000, agents: int = 100, subscribers: int = 10) -> list[Figure]:
    """Events per second to one subscriber (one frame each, and batched) and to many."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        last, runs = asyncio.run(_measure(count, agents, subscribers, pool))

    def rate(name: str) -> float:
        return runs[name].events / runs[name].seconds

    single, batched = rate("event frames, 1 subscriber"), rate("events frames, 1 subscriber")
    many = f"events frames, {subscribers} subscribers"
    return [
        Figure("events in the log", last, "events"),
        Figure("1 subscriber, one `event` frame per event", single, "events/s"),
        Figure("1 subscriber, `events` frames (batch: true)", batched, "events/s"),
        Figure("... events per frame", runs["events frames, 1 subscriber"].events
               / runs["events frames, 1 subscriber"].frames, "events"),
        Figure("batched / one frame per event", batched / single, "x"),
        Figure(f"{subscribers} subscribers at once, `events` frames: all of them together",
               rate(many), "events/s"),
        Figure("1 subscriber through gateway.client (batched, pydantic-checked)",
               rate("gateway.client"), "events/s"),
    ]


if __name__ == "__main__":
    run(measure, requests=50_000, agents=100, subscribers=10)
