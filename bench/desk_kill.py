"""The desk kill's time: from the HTTP POST to every agent HALTED and every open order's
cancel sent to the broker adapter.

The gateway runs in this process (uvicorn on 127.0.0.1, SQLite with ``synchronous=FULL``)
with ``agents`` agents and a broker adapter that keeps every limit order open and notes when
each cancel reaches it. Before each kill, the agents place ``orders`` orders between them (spread
evenly) and each has a run going that waits until it is cancelled. Then one
``POST /api/desk/kill`` (a control token) and, per repetition, on one clock
(``time.perf_counter``):

- POST -> answer: every agent's stop committed (HALTED, durable) and the one ``DeskKilled``
  event committed after them;
- POST -> every agent HALTED: the commit time (the store's clock, whole ms, against the
  wall clock at the POST) of the last agent's stop; the kill commits every stop before its
  record (and before any flatten);
- POST -> last cancel: the broker adapter was asked to cancel every open order;
- POST -> all done: the latest of them.

Each repetition starts a fresh gateway on a fresh log, and is followed by the way the panel
stopped all before (one ``POST /api/agents/{id}/control`` per agent, all at once) on another
fresh gateway, for a ratio measured in the same run.

With ``--flatten yes`` each agent also holds a position (a market buy the adapter fills at
once, the one market order it fills) and the kill is sent with ``flatten: true``; then also
POST -> last flatten order sent: the broker adapter was given every closing order.

(The per-agent comparison stays without flatten: it is the panel's way before the desk kill.)

    uv run python -m bench.desk_kill [--agents 50] [--orders 200] [--reps 5] [--flatten yes]
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from bench.common import Figure, run
from bench.ws_ingest import CONTROL_TOKEN, TOKENS, agent_names
from gateway.edge.app import create_app
from gateway.edge.server import bind
from gateway.edge.service import Service
from gateway.llm.reasoner import RunContext, RunResult
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, parse_request
from lanes.events import BrokerReport, OrderIntent, Outcome, TradingState
from store import SqliteEventStore

TIMEOUT = 120.0
_ids = count(1)


class Trader:
    """A run places the orders its requests list; a request with ``hold`` waits until its
    run is cancelled."""

    def __call__(self, _agent_id: str) -> Trader:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        if any(r.payload.get("hold") for r in ctx.requests):
            await asyncio.Event().wait()
        orders = tuple(OrderIntent.model_validate(o) for r in ctx.requests
                       for o in r.payload.get("orders", []))
        return RunResult(outcome=Outcome.TRADE if orders else Outcome.NO_TRADE, orders=orders)


class Broker:
    """Keeps every limit order open and fills every market order at once (through
    ``engine``, once set); notes when each cancel and each flatten order reaches it."""

    def __init__(self) -> None:
        self.placed = 0
        self.cancels: list[float] = []
        self.flattens: list[float] = []
        self.all_placed = asyncio.Event()
        self.all_cancelled = asyncio.Event()
        self.all_flattened = asyncio.Event()
        self.expected = 0
        self.expected_flattens = 0
        self.engine: Engine | None = None

    async def place(self, agent_id: str, order_id: str, intent: OrderIntent) -> None:
        if intent.order_type == "market":
            if "-flat" in order_id:
                self.flattens.append(time.perf_counter())
                if len(self.flattens) >= self.expected_flattens:
                    self.all_flattened.set()
                return
            assert self.engine is not None
            await self.engine.report(agent_id, BrokerReport(
                at=self.engine.clock.now_ms(), order_id=order_id, status="filled",
                filled_qty=intent.qty, price=100.0))
            return
        self.placed += 1
        if self.placed >= self.expected:
            self.all_placed.set()

    async def cancel(self, agent_id: str, order_id: str) -> None:
        self.cancels.append(time.perf_counter())
        if len(self.cancels) >= self.expected:
            self.all_cancelled.set()


def trigger(agent: str, **payload: Any) -> Any:
    n = next(_ids)
    return parse_request({
        "requestId": f"bk{n}", "createdAt": datetime.now(UTC), "agentId": agent,
        "kind": "hook_trigger", "dedupeKey": f"bk{n}", "payload": payload})


@contextlib.asynccontextmanager
async def gateway(db: Path, agents: list[str], broker: Broker
                  ) -> AsyncIterator[tuple[str, Engine]]:
    """The gateway on 127.0.0.1:<ephemeral> over SQLite (``synchronous=FULL``) with
    ``broker``: its base URL and engine."""
    configs = {a: AgentConfig(mode=Mode.FOLLOWUP) for a in agents}
    engine = Engine(SqliteEventStore(db, synchronous="FULL"), configs, reasoners=Trader(),
                    broker=broker)
    service = Service(engine=engine, tokens=TOKENS)
    ready = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await engine.start()
        ready.set()
        try:
            yield
        finally:
            await engine.stop()

    sock = bind("127.0.0.1", 0)  # as `gateway serve` binds (Nagle off on each connection)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(service, lifespan=lifespan),
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(ready.wait(), TIMEOUT)
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)
        sock.close()


async def one_kill(scratch: Path, agents: int, orders: int, per_agent: bool = False,
                   flatten: bool = False) -> tuple[float, float, int, float, float]:
    """One kill on a fresh gateway: (POST -> answer, POST -> last cancel) in ms, the
    cancels it requested, and with ``flatten`` (POST -> every agent HALTED, POST -> last
    flatten order sent) in ms (else 0, 0). ``per_agent``: the way the panel stopped all
    before the desk kill, one ``POST /api/agents/{id}/control`` per agent, all sent at once
    (the answer: the last of them)."""
    names = agent_names(agents)
    broker = Broker()
    broker.expected = orders
    broker.expected_flattens = agents if flatten else 0
    async with gateway(scratch / "desk.db", names, broker) as (url, engine):
        broker.engine = engine
        if flatten:
            for agent in names:
                await engine.submit(trigger(agent, orders=[
                    {"symbol": "ETHUSD", "side": "buy", "qty": 1}]))
            deadline = time.monotonic() + TIMEOUT
            while not all(engine.state(a).positions.get("ETHUSD") for a in names):
                if time.monotonic() > deadline:
                    raise RuntimeError("the positions were not filled")
                await asyncio.sleep(0.01)
        for index, agent in enumerate(names):
            mine = orders // agents + (1 if index < orders % agents else 0)
            intents = [{"symbol": "BTCUSD", "side": "buy", "qty": 1, "orderType": "limit",
                        "limitPrice": 50_000 + n} for n in range(mine)]
            await engine.submit(trigger(agent, orders=intents))
        await asyncio.wait_for(broker.all_placed.wait(), TIMEOUT)
        for agent in names:
            await engine.submit(trigger(agent, hold=True))
        deadline = time.monotonic() + TIMEOUT
        while not all(engine.state(a).active is not None for a in names):
            if time.monotonic() > deadline:
                raise RuntimeError("the holding runs did not start")
            await asyncio.sleep(0.01)
        await engine.flush()
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT, headers={
                "Authorization": f"Bearer {CONTROL_TOKEN}"}) as client:
            start, wall = time.perf_counter(), time.time() * 1000
            if per_agent:
                stops = await asyncio.gather(*(client.post(
                    f"/api/agents/{a}/control", json={"action": "emergency_stop"})
                    for a in names))
                answered = time.perf_counter()
                for stop in stops:
                    stop.raise_for_status()
                requested = sum(s.json()["effect"]["cancelsRequested"] for s in stops)
            else:
                body: dict[str, Any] = {"reason": "bench"}
                if flatten:
                    body["flatten"] = True
                response = await client.post("/api/desk/kill", json=body)
                answered = time.perf_counter()
                response.raise_for_status()
                requested = response.json()["cancelsRequested"]
                if flatten and response.json()["flattenOrders"] != agents:
                    raise RuntimeError(f"flatten orders: {response.json()['flattenOrders']}")
        await asyncio.wait_for(broker.all_cancelled.wait(), TIMEOUT)
        if not all(engine.state(a).trading is TradingState.HALTED for a in names):
            raise RuntimeError("not every agent HALTED")
        halted_ms = flatten_ms = 0.0
        if flatten:
            await asyncio.wait_for(broker.all_flattened.wait(), TIMEOUT)
            flatten_ms = (max(broker.flattens) - start) * 1000
        if not per_agent:
            await engine.flush()
            halted_ms = await _halted_at(engine, names, response.json()["kill"]["killId"]) - wall
        return ((answered - start) * 1000, (max(broker.cancels) - start) * 1000, requested,
                halted_ms, flatten_ms)


async def _halted_at(engine: Engine, names: list[str], kill_id: str) -> float:
    """When the last agent's stop of kill ``kill_id`` was committed (ms since the epoch)."""
    last = 0
    for agent in names:
        records = await engine.store.read_stream(agent)
        last = max(last, max(r.recorded_at for r in records
                             if r.type == "ControlApplied" and f'"{kill_id}"' in r.data))
    return float(last)


def measure(agents: int = 50, orders: int = 200, reps: int = 5,
            flatten: str = "no") -> list[Figure]:
    """``reps`` desk kills, each on a fresh gateway, their p50 and worst; and, alternating
    with them, the same stop as one POST per agent, for the ratio. ``flatten`` ``yes``:
    the kills flatten a position per agent too."""
    flattening = flatten == "yes"
    answers: list[float] = []
    cancels: list[float] = []
    singles: list[float] = []
    halted: list[float] = []
    flattened: list[float] = []
    requested = 0
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as scratch:
            answer_ms, cancel_ms, requested, halted_ms, flatten_ms = asyncio.run(one_kill(
                Path(scratch), agents, orders, flatten=flattening))
            halted.append(halted_ms)
            flattened.append(flatten_ms)
        with tempfile.TemporaryDirectory() as scratch:
            single = asyncio.run(one_kill(Path(scratch), agents, orders, per_agent=True))
        if requested != orders or single[2] != orders:
            raise RuntimeError(f"cancels requested: {requested} and {single[2]} of {orders}")
        answers.append(answer_ms)
        cancels.append(cancel_ms)
        singles.append(max(single[:2]))
    done = [max(a, c, f) for a, c, f in zip(answers, cancels, flattened, strict=True)]
    what = f"{agents} agents, {orders} open orders, {reps} kills" + (
        f", flatten: {agents} positions" if flattening else "")
    flat = [Figure("desk kill: POST -> last flatten order sent to the broker, p50",
                   statistics.median(flattened), "ms")] if flattening else []
    return [
        Figure(f"desk kill: POST -> answer (every agent HALTED, recorded), p50 [{what}]",
               statistics.median(answers), "ms"),
        Figure("desk kill: POST -> every agent HALTED (last stop committed), p50",
               statistics.median(halted), "ms"), *flat,
        Figure("desk kill: POST -> last cancel sent to the broker, p50",
               statistics.median(cancels), "ms"),
        Figure("desk kill: POST -> all done (the latest of them), p50",
               statistics.median(done), "ms"),
        Figure("desk kill: all done, worst", max(done), "ms"),
        Figure("desk kill: cancels requested per kill", requested, ""),
        Figure(f"one POST per agent, sent at once: all done, p50 [{agents} POSTs]",
               statistics.median(singles), "ms"),
        Figure("desk kill all done / one POST per agent all done (p50s, same run)",
               statistics.median(done) / statistics.median(singles), "x"),
    ]


if __name__ == "__main__":
    run(measure, {"flatten": ["no", "yes"]}, agents=50, orders=200, reps=5)
