"""A live gateway with the simulated feed for the browser tests, and a relay that can cut
the network between the browser and it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import httpx2

from gateway.base.clock import SystemClock
from gateway.config import GatewayConfig, validate_config
from gateway.edge.server import Running, serving
from gateway.market.feed import SyntheticFeed
from gateway.wiring import build_service, feed_market
from lanes.state import AgentState
from tests.gateway.support import until

CONTROL = "panel-control-secret"
VIEWER = "panel-viewer-secret"
ADMIN = "panel-admin-secret"
SCOPED = "panel-alpha-desk-secret"
"""A viewer token scoped to the agent ``alpha``."""
TIMEOUT = 10.0
_ids = count(1)

BTC_LEVELS = [63_960.0 + 10 * n for n in range(9)]
"""Price levels around the feed's start: a lively market crosses some of them every second."""


def agent(agent_id: str, latency_ms: tuple[int, int] = (200, 600), **lane: Any) -> dict[str, Any]:
    """An ``[[agents]]`` table with a simulated reasoner behind the simulated provider."""
    return {"id": agent_id, "mode": "followup", "cap": 200, **lane,
            "reasoner": {"latency_ms": list(latency_ms), "trade_probability": 0.3, "turns": 1,
                         "seed": next(_ids), "provider": "sim-llm"}}


def panel_config(db: Path, agents: list[dict[str, Any]], hooked: list[str]) -> GatewayConfig:
    """A config with these agents; the ``hooked`` ones get a request at every crossing of
    one of `BTC_LEVELS` by the synthetic feed."""
    tokens: list[dict[str, Any]] = [{"name": "ops", "token": CONTROL, "role": "control"},
                                     {"name": "watcher", "token": VIEWER, "role": "viewer"},
                                     {"name": "root", "token": ADMIN, "role": "admin"}]
    if any(a["id"] == "alpha" for a in agents):
        tokens.append({"name": "alpha-desk", "token": SCOPED, "role": "viewer",
                       "agents": ["alpha"]})
    return validate_config({
        "server": {"host": "127.0.0.1", "port": 0},
        "store": {"path": str(db), "synchronous": "NORMAL"},
        "tokens": tokens,
        "providers": [{"name": "sim-llm", "kind": "simulated",
                       "limits": {"requests_per_minute": 6_000, "max_concurrent": 50}}],
        "agents": agents,
        "hooks": [{"kind": "price_cross", "name": f"btc_{int(level)}", "symbol": "BTCUSD",
                   "level": level, "direction": "both", "agents": hooked}
                  for level in BTC_LEVELS] if hooked else [],
    }, "<browser tests>")


@contextlib.asynccontextmanager
async def live_gateway(config: GatewayConfig, db: Path, feed: bool = True
                       ) -> AsyncIterator[Running]:
    """Serve ``config`` on 127.0.0.1 (ephemeral port) with a lively synthetic BTCUSD feed;
    stopped gracefully when the block ends."""
    service = build_service(config, db)
    clock = SystemClock()

    def market(svc: object) -> Any:
        ticks = SyntheticFeed({"BTCUSD": 64_000.0}, seed=11, tick_ms=20, volatility=4.0)
        return feed_market(service, ticks, clock)

    async with serving(service, extra=market if feed else None) as running:
        yield running


@contextlib.asynccontextmanager
async def relayed(running: Running) -> AsyncIterator[Relay]:
    """A `Relay` in front of ``running``, whose origin the gateway allows (the page comes
    through it as through a proxy)."""
    async with Relay(int(running.url.rsplit(":", 1)[1])) as relay:
        running.service.allowed_origins = frozenset({relay.url})
        yield relay


def request(agent_id: str, kind: str = "hook_trigger", **fields: Any) -> dict[str, Any]:
    """An AgentRequest on the wire, with a fresh requestId and dedupe key."""
    n = next(_ids)
    body: dict[str, Any] = {"requestId": f"bt_{n}", "createdAt": datetime.now(UTC).isoformat(),
                            "agentId": agent_id, "kind": kind, **fields}
    if kind == "hook_trigger":
        body.setdefault("dedupeKey", f"browser-test:{n}")
    return body


def http(running: Running, token: str = CONTROL) -> httpx2.AsyncClient:
    """An HTTP client of the gateway itself (not through any relay)."""
    return httpx2.AsyncClient(base_url=running.url, timeout=TIMEOUT,
                             headers={"Authorization": f"Bearer {token}"})


async def state_is(running: Running, agent_id: str, test: Callable[[AgentState], object],
                   what: str) -> None:
    """Wait until the agent's state passes ``test`` (``what`` names it if it never does)."""
    async def holds() -> bool:
        return bool(test(running.service.engine.state(agent_id)))
    await until(holds, what)


async def submit(running: Running, body: dict[str, Any]) -> dict[str, Any]:
    """Submit a request over HTTP; its ack."""
    async with http(running) as client:
        response = await client.post(f"/api/agents/{body['agentId']}/requests", json=body)
        response.raise_for_status()
        ack: dict[str, Any] = response.json()
        return ack


class Relay:
    """A TCP relay in front of the gateway. ``cut`` drops every connection and refuses new
    ones (the browser sees the network go), ``restore`` lets them through again; ``freeze``
    holds every byte while the connections stay open (a frozen gateway, as the browser sees
    it), ``thaw`` lets what was held through."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cutting = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pipes: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Relay:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        self.cut()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    def cut(self) -> None:
        """Drop every open connection; refuse new ones until `restore`."""
        self.cutting = True
        for writer in list(self.pipes):
            writer.transport.abort()
        self.pipes.clear()

    def restore(self) -> None:
        """Let connections through again."""
        self.cutting = False

    def freeze(self) -> None:
        """Forward nothing more, either way, and drop nothing (new connections are taken and
        held too)."""
        self.flowing.clear()

    def thaw(self) -> None:
        """Forward again, what was held first."""
        self.flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cutting:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.transport.abort()
            return
        self.pipes |= {writer, upstream}
        for source, sink in ((reader, upstream), (upstream_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65_536):
                await self.flowing.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.pipes.discard(sink)
            sink.transport.abort()
