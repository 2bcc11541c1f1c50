"""Durable feed ingest over one WebSocket (ack after commit), as a ratio to a bare
websockets server that only parses each frame and acks it, measured in the same run.

The gateway runs in this process (uvicorn on 127.0.0.1, an ephemeral port, SQLite with
``synchronous=FULL``, agents whose runs never end so every request queues, caps that never
drop); the client runs in a child process, so the server has a core of its own. The client
sends ``hook_trigger`` submits over one connection, pipelined: (a) one request per frame with
up to ``window`` frames in flight, (b) 100 per frame (``submit_many``) with up to
``window / 10`` frames in flight. The bare server gets the very same frames from the very
same client code. A last figure runs (a) through `gateway.client` instead of raw frames.
The gateway is served as `gateway serve` serves it (its uvicorn protocols, on the event loop
``--loop`` names, by default the one `gateway serve` picks: uvloop on Linux); the bare server
runs on asyncio's own loop, in every run (the fixed yardstick).

    uv run python -m bench.ws_ingest [--requests N] [--batched N] [--agents N] [--window N]
                                     [--loop auto|asyncio|uvloop]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import uvicorn
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from bench.common import CREATED, Figure, run
from gateway.base.process import EventLoop, run_on, tune_runtime
from gateway.base.roles import Role
from gateway.client import FeedClient
from gateway.cluster.peers import Peers
from gateway.cluster.router import Router
from gateway.edge.auth import Principal, TokenBook
from gateway.edge.server import bind, join_cluster, uvicorn_config
from gateway.edge.service import Service
from gateway.llm.reasoner import Reasoner, RunContext, RunResult
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentRequest, Mode, parse_request
from store import DEFAULT_MAX_BATCH, EventStore, PostgresEventStore, SqliteEventStore

FEED_TOKEN = "bench-feed-token"
CONTROL_TOKEN = "bench-control-token"
TOKENS = TokenBook([(FEED_TOKEN, Principal("bench-feed", Role.FEED)),
                    (CONTROL_TOKEN, Principal("bench-ops", Role.CONTROL))])
BATCH = 100
TIMEOUT = 120.0


class Hang:
    """A reasoner whose runs never end (until cancelled): later requests all queue."""

    async def run(self, ctx: RunContext) -> RunResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def agent_names(agents: int) -> list[str]:
    """The bench agents' ids."""
    return [f"a{n:04d}" for n in range(agents)]


@contextlib.asynccontextmanager
async def gateway(db: Path | str, agents: dict[str, AgentConfig],
                  reasoners: Callable[[str], Reasoner], max_batch: int = DEFAULT_MAX_BATCH
                  ) -> AsyncIterator[tuple[str, Engine]]:
    """The real gateway on 127.0.0.1:<ephemeral> over SQLite (``synchronous=FULL``, at most
    ``max_batch`` events per commit), or over PostgreSQL for a ``postgresql://`` ``db`` (a
    cluster of one member, as `gateway serve` makes it): its ``ws://`` base URL and its
    engine. Stopped gracefully after the block."""
    clustered = isinstance(db, str)
    store: EventStore = PostgresEventStore(db, max_batch=max_batch) if isinstance(db, str) \
        else SqliteEventStore(db, synchronous="FULL", max_batch=max_batch)
    peers = Peers("bench-cluster") if clustered else None
    router = Router(peers) if peers is not None else None
    engine = Engine(store, agents, reasoners=reasoners, snapshot_worker=True,
                    elsewhere=router)  # as `gateway serve` does
    service = Service(engine=engine, tokens=TOKENS, peers=peers, router=router,
                      cluster_secret="bench-cluster" if clustered else None)
    ready = asyncio.Event()
    sock = bind("127.0.0.1", 0)  # as `gateway serve` binds (Nagle off on each connection)
    port = sock.getsockname()[1]

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await engine.start()
        member = await join_cluster(service, f"http://127.0.0.1:{port}") if clustered \
            else None
        tune_runtime()
        ready.set()
        try:
            yield
        finally:
            if member is not None:
                await member.stop()
            await engine.stop()
            if service.peers is not None:
                await service.peers.close()

    server = uvicorn.Server(uvicorn_config(service, lifespan))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        started = asyncio.create_task(ready.wait())
        await asyncio.wait([started, task], timeout=TIMEOUT, return_when="FIRST_COMPLETED")
        if not ready.is_set():
            started.cancel()
            raise RuntimeError(f"the gateway did not start: {task}")
        yield f"ws://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)
        sock.close()


async def _bare_handler(ws: ServerConnection) -> None:
    """Parse each frame, answer a small JSON ack; nothing else."""
    await ws.send('{"type":"hello","protocol":1,"principal":"bare","role":"feed"}')
    position = 0
    async for raw in ws:
        frame = json.loads(raw)
        position += 1
        if frame["type"] == "submit":
            await ws.send(json.dumps({"type": "ack", "id": frame["id"],
                                      "requestId": frame["request"]["requestId"],
                                      "decision": "accepted", "position": position}))
        else:
            await ws.send(json.dumps({"type": "acks", "id": frame["id"],
                                      "accepted": len(frame["requests"])}))


@contextlib.asynccontextmanager
async def bare_server() -> AsyncIterator[str]:
    """A bare websockets server on 127.0.0.1:<ephemeral>: its base URL."""
    async with serve(_bare_handler, "127.0.0.1", 0, compression=None,
                     max_size=4 << 20) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


# --------------------------------------------------------------- the client (child process)


def request_json(tag: str, n: int, agent: str) -> str:
    """A hook trigger's wire JSON text."""
    return (f'{{"requestId":"{tag}{n}","createdAt":"{CREATED}","agentId":"{agent}",'
            f'"kind":"hook_trigger","dedupeKey":"{tag}:{n}",'
            f'"payload":{{"symbol":"BTCUSD","n":{n}}}}}')


def frames(tag: str, count: int, batch: int, agents: list[str]) -> dict[str, str]:
    """``count`` requests round-robin over ``agents``, ``batch`` per frame (1: ``submit``):
    each frame's text by its id."""
    out = {}
    for start in range(0, count, batch):
        items = [request_json(tag, n, agents[n % len(agents)])
                 for n in range(start, min(count, start + batch))]
        frame_id = f"{tag}f{start}"
        if batch == 1:
            out[frame_id] = f'{{"type":"submit","id":"{frame_id}","request":{items[0]}}}'
        else:
            out[frame_id] = (f'{{"type":"submit_many","id":"{frame_id}",'
                             f'"requests":[{",".join(items)}]}}')
    return out


@dataclass(frozen=True, slots=True)
class Load:
    """What one client run measured."""

    seconds: float
    accepted: int
    busy: int


def client_load(url: str, tag: str, count: int, batch: int, agents: int, window: int) -> Load:
    """In a child process: pipeline the frames over one connection, count the acks."""
    texts = frames(tag, count, batch, agent_names(agents))
    return asyncio.run(_pipeline(f"{url}/ws/feed", texts, window))


async def _pipeline(url: str, by_id: dict[str, str], window: int) -> Load:
    async with connect(url, additional_headers={"Authorization": f"Bearer {FEED_TOKEN}"},
                       compression=None, max_size=16 << 20) as ws:
        hello = json.loads(await ws.recv())
        assert hello["type"] == "hello", hello
        slots = asyncio.Semaphore(window)
        loop = asyncio.get_running_loop()
        accepted = busy = answered = 0
        resending: set[asyncio.Task[None]] = set()

        def resend(frame_id: str) -> None:
            task = loop.create_task(ws.send(by_id[frame_id]))
            resending.add(task)
            task.add_done_callback(resending.discard)

        async def read() -> None:
            nonlocal accepted, busy, answered
            async for raw in ws:
                answer = json.loads(raw)
                kind = answer["type"]
                if kind == "busy":
                    busy += 1
                    loop.call_later(answer["retryAfterMs"] / 1000, resend, answer["id"])
                    continue
                if kind == "ack":
                    accepted += answer["decision"] == "accepted"
                elif kind == "acks":
                    accepted += answer["accepted"] if "accepted" in answer else sum(
                        r.get("decision") == "accepted" for r in answer["results"])
                else:
                    raise RuntimeError(f"unexpected answer: {raw[:300]!r}")
                answered += 1
                slots.release()
                if answered == len(by_id):
                    return

        start = time.perf_counter()
        reading = asyncio.create_task(read())
        for text in by_id.values():
            await slots.acquire()
            await ws.send(text)
        await asyncio.wait_for(reading, TIMEOUT)
        return Load(time.perf_counter() - start, accepted, busy)


def client_library_load(url: str, tag: str, count: int, agents: int, window: int) -> Load:
    """In a child process: the same single-request load through `gateway.client`."""
    names = agent_names(agents)
    requests = [json.loads(request_json(tag, n, names[n % len(names)])) for n in range(count)]
    return asyncio.run(_through_client(url, requests, window))


async def _through_client(url: str, requests: list[dict[str, Any]], window: int) -> Load:
    async with FeedClient(url, FEED_TOKEN) as client:
        accepted = 0
        queue = iter(requests)

        async def worker() -> None:
            nonlocal accepted
            for request in queue:
                ack = await client.submit(request)
                accepted += ack.decision == "accepted"

        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(window))), TIMEOUT)
        return Load(time.perf_counter() - start, accepted, 0)


# ------------------------------------------------------------------------------ measure


async def _in_child(pool: ProcessPoolExecutor, fn: Callable[[], Load]) -> Load:
    return await asyncio.get_running_loop().run_in_executor(pool, fn)


async def _measure(count: int, batched: int, agents: int, window: int,
                   pool: ProcessPoolExecutor) -> dict[str, Load]:
    runs: dict[str, Load] = {}
    child = partial(_in_child, pool)
    await child(partial(Load, 0.0, 0, 0))  # start the child process before timing anything
    per_agent = (2 * count + batched) // agents + 10
    config = AgentConfig(mode=Mode.FOLLOWUP, cap=min(100_000, 2 * per_agent))
    names = agent_names(agents)
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway(Path(tmp, "ingest.db"), dict.fromkeys(names, config),
                           lambda _: Hang()) as (url, engine):
            for n, name in enumerate(names):  # every agent busy: what follows queues
                await engine.submit(_first(name, n))
            runs["gateway single"] = await child(
                partial(client_load, url, "g1-", count, 1, agents, window))
            runs["gateway batched"] = await child(
                partial(client_load, url, "g100-", batched, BATCH, agents, window // 10))
            runs["gateway client"] = await child(
                partial(client_library_load, url, "gc-", count, agents, window))
            await engine.flush()
    return runs


async def _measure_bare(count: int, batched: int, agents: int, window: int,
                        pool: ProcessPoolExecutor) -> dict[str, Load]:
    runs: dict[str, Load] = {}
    child = partial(_in_child, pool)
    async with bare_server() as url:
        runs["bare single"] = await child(
            partial(client_load, url, "b1-", count, 1, agents, window))
        runs["bare batched"] = await child(
            partial(client_load, url, "b100-", batched, BATCH, agents, window // 10))
    return runs


def _check(runs: dict[str, Load], count: int, batched: int) -> None:
    for name, load in runs.items():
        expected = count if "single" in name or "client" in name else batched
        if load.accepted != expected:
            raise AssertionError(f"{name}: {load.accepted} of {expected} accepted")


def _first(agent: str, n: int) -> AgentRequest:
    return parse_request(json.loads(request_json("first-", n, agent)))


def measure(count: int = 20_000, batched: int = 100_000, agents: int = 100,
            window: int = 500, loop: EventLoop = "auto") -> list[Figure]:
    """Gateway (on the event loop ``loop``) vs bare websockets server (on asyncio's), one
    connection, same client, same frames."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        runs = run_on(_measure(count, batched, agents, window, pool), loop)
        runs |= asyncio.run(_measure_bare(count, batched, agents, window, pool))
    _check(runs, count, batched)

    def rate(name: str, n: int) -> float:
        return n / runs[name].seconds

    single, many = rate("gateway single", count), rate("gateway batched", batched)
    bare_single, bare_many = rate("bare single", count), rate("bare batched", batched)
    return [
        Figure(f"gateway, 1 request/frame, {window} frames in flight: acked req/s", single,
               "req/s"),
        Figure(f"gateway, {BATCH} requests/frame, {window // 10} frames in flight: acked req/s",
               many, "req/s"),
        Figure("gateway, 1 request/frame through gateway.client", rate("gateway client", count),
               "req/s"),
        Figure("bare websockets server, 1 request/frame", bare_single, "req/s"),
        Figure(f"bare websockets server, {BATCH} requests/frame", bare_many, "req/s"),
        Figure("gateway / bare, 1 request/frame", single / bare_single, "x", ">= 0.5"),
        Figure(f"gateway / bare, {BATCH} requests/frame", many / bare_many, "x"),
        Figure("busy answers (retried)", sum(load.busy for load in runs.values()), "frames"),
    ]


if __name__ == "__main__":
    run(measure, {"loop": ("auto", "asyncio", "uvloop")}, requests=20_000, batched=100_000,
        agents=100, window=500)
